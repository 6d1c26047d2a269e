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
}

func templateOut(t *template.Template) templateJSON {
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	return templateJSON{
		TemplateID: t.ID, BuildID: t.ID, BuildStatus: "ready", CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
		EnvdVersion: sandbox.EnvdVersion, Public: true, Aliases: aliases, Names: aliases, CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.CreatedAt.UTC(),
		BuildCount: 1, SizeBytes: t.SizeBytes,
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.templates.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateOut(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.templates.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	t, err := s.templates.Get(r.Context(), r.PathValue("alias"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": true})
}
