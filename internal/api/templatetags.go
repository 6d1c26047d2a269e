package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/template"
)

// TemplateTagger moves tags between templates of one name (the E2B tag
// API). *template.Store implements it.
type TemplateTagger interface {
	AssignTags(ctx context.Context, team, target string, tags []string) (*template.Template, error)
	RemoveTags(ctx context.Context, team, name string, tags []string) error
}

// templateTagRoutes registers the E2B tag endpoints.
func (s *Server) templateTagRoutes(auth func(string, http.HandlerFunc)) {
	auth("POST /templates/tags", s.assignTemplateTags)
	auth("DELETE /templates/tags", s.deleteTemplateTags)
	// "GET /templates/{id}/tags" would conflict with "GET
	// /templates/aliases/{alias}" (neither is more specific), so the
	// segment is matched here; /templates/aliases/tags stays an alias lookup.
	auth("GET /templates/{id}/{sub}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("sub") != "tags" {
			httperr.Write(w, fmt.Errorf("%s: %w", r.URL.Path, errdefs.ErrNotFound))
			return
		}
		s.listTemplateTags(w, r)
	})
}

func (s *Server) tagger() (TemplateTagger, error) {
	t, ok := s.templates.(TemplateTagger)
	if !ok {
		return nil, fmt.Errorf("this server cannot tag templates: %w", errdefs.ErrUnavailable)
	}
	return t, nil
}

func (s *Server) assignTemplateTags(w http.ResponseWriter, r *http.Request) {
	var b rest.AssignTemplateTagsRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &b); err != nil {
		httperr.Write(w, err)
		return
	}
	if b.Target == "" || len(b.Tags) == 0 {
		httperr.Write(w, invalid("target (name:tag) and tags are required"))
		return
	}
	tg, err := s.tagger()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	t, err := tg.AssignTags(r.Context(), keyOf(r.Context()).TeamID, b.Target, b.Tags)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, rest.AssignedTemplateTags{BuildID: template.BuildRef(t), Tags: b.Tags})
}

func (s *Server) deleteTemplateTags(w http.ResponseWriter, r *http.Request) {
	var b rest.DeleteTemplateTagsRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &b); err != nil {
		httperr.Write(w, err)
		return
	}
	// The name may come as name:tag; the tag part adds nothing here.
	name, _, _ := strings.Cut(b.Name, ":")
	if name == "" || len(b.Tags) == 0 {
		httperr.Write(w, invalid("name and tags are required"))
		return
	}
	tg, err := s.tagger()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := tg.RemoveTags(r.Context(), keyOf(r.Context()).TeamID, name, b.Tags); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listTemplateTags lists the tags of a template ID or of every template of
// a name (each template is one build).
func (s *Server) listTemplateTags(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	all, err := s.templates.List(r.Context(), keyOf(r.Context()).TeamID)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := []rest.TemplateTag{}
	found := false
	for _, t := range all {
		match := t.ID == ref
		for _, a := range t.Aliases {
			match = match || a == ref
		}
		if !match {
			continue
		}
		found = true
		for _, name := range template.TagsOf(t) {
			out = append(out, rest.TemplateTag{Tag: name, BuildID: template.BuildRef(t), CreatedAt: t.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z")})
		}
	}
	if !found {
		httperr.Write(w, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}
