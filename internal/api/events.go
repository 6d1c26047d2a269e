package api

import (
	"fmt"
	"net/http"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/httperr"
)

// EventRoutes serves lifecycle events and webhooks (*events.Service).
type EventRoutes interface {
	Routes(team events.TeamFunc) map[string]http.HandlerFunc
}

// SetEvents serves e's routes behind the API key check. Call before serving.
func (s *Server) SetEvents(e EventRoutes) { s.events = e }

// eventsRoutes mounts the events API, each route scoped to the caller's
// team; without SetEvents they answer 503.
func (s *Server) eventsRoutes(auth func(string, http.HandlerFunc)) {
	if s.events == nil {
		off := func(w http.ResponseWriter, r *http.Request) {
			httperr.Write(w, fmt.Errorf("lifecycle events are not enabled on this server: %w", errdefs.ErrUnavailable))
		}
		for _, p := range []string{"GET /events/sandboxes", "GET /events/sandboxes/{sandboxID}", "/events/webhooks", "/events/webhooks/{webhookID}"} {
			auth(p, off)
		}
		return
	}
	team := func(r *http.Request) string { return keyOf(r.Context()).TeamID }
	for pattern, h := range s.events.Routes(team) {
		auth(pattern, h)
	}
}
