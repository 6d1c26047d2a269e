package api

import (
	"net/http"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/template"
)

// templateOut is E2B's Template list item (and agentbox's extensions).
func templateOut(t *template.Template, team string) rest.Template {
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	out := rest.Template{
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
		httperr.Write(w, err)
		return
	}
	out := make([]rest.Template, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateOut(t, team))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// getTemplate shows a template the team may use: its own, a builtin or a
// public one; another team's private template is a 404.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	team := keyOf(r.Context()).TeamID
	t, err := s.templates.Get(r.Context(), team, r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, templateOut(t, team))
}

func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	team := keyOf(r.Context()).TeamID
	t, err := s.templates.Get(r.Context(), team, r.PathValue("alias"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, rest.TemplateAliasResponse{TemplateID: t.ID, Public: !t.OwnedBy(team)})
}
