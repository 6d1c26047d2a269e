package api

import (
	"net/http"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/template"
)

// templateJSON is E2B's Template list item.
type templateJSON struct {
	TemplateID    string    `json:"templateID"`
	BuildID       string    `json:"buildID"`
	BuildStatus   string    `json:"buildStatus"`
	CPUCount      int       `json:"cpuCount"`
	MemoryMB      int       `json:"memoryMB"`
	DiskSizeMB    int       `json:"diskSizeMB"`
	EnvdVersion   string    `json:"envdVersion"`
	Public        bool      `json:"public"`
	Aliases       []string  `json:"aliases"`
	Names         []string  `json:"names"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
	CreatedBy     *struct{} `json:"createdBy"`
	LastSpawnedAt *string   `json:"lastSpawnedAt"`
	SpawnCount    int       `json:"spawnCount"`
	BuildCount    int       `json:"buildCount"`
	SizeBytes     int64     `json:"sizeBytes"`
	// agentbox extensions
	Tags           []string          `json:"tags"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	StartCmd       string            `json:"startCmd,omitempty"`
	ReadyCmd       string            `json:"readyCmd,omitempty"`
	ExposedPorts   []int             `json:"exposedPorts,omitempty"`
	Isolation      string            `json:"isolation,omitempty"`
	Layers         []string          `json:"layers,omitempty"`
	Source         string            `json:"source,omitempty"`
	BuildSeconds   float64           `json:"buildSeconds,omitempty"`
}

func templateOut(t *template.Template, team string) templateJSON {
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	out := templateJSON{
		TemplateID: t.ID, BuildID: template.BuildRef(t), BuildStatus: "ready", CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
		EnvdVersion: sandbox.EnvdVersion, Public: !t.OwnedBy(team), Aliases: aliases, Names: aliases, CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.CreatedAt.UTC(),
		BuildCount: 1, SizeBytes: t.SizeBytes,
		Tags: t.Tags, DefaultUser: t.DefaultUser, DefaultWorkdir: t.DefaultWorkdir, Env: t.Env, StartCmd: t.StartCmd,
		ReadyCmd: t.ReadyCmd, ExposedPorts: t.ExposedPorts, Isolation: t.Isolation, Layers: t.LayerIDs, Source: t.Source,
		BuildSeconds: t.BuildSeconds,
	}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	return out
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	team := keyOf(r.Context()).TeamID
	ts, err := s.templates.List(r.Context(), team)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateOut(t, team))
	}
	writeJSON(w, http.StatusOK, out)
}

// getTemplate shows a template the team may use: its own, a builtin or a
// public one; another team's private template is a 404.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	team := keyOf(r.Context()).TeamID
	t, err := s.templates.Get(r.Context(), team, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t, team))
}

func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	team := keyOf(r.Context()).TeamID
	t, err := s.templates.Get(r.Context(), team, r.PathValue("alias"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": !t.OwnedBy(team)})
}
