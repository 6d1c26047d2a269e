package kubeapi

import "github.com/agentbox/agentbox/internal/api"

// SetEvents serves lifecycle events and webhooks with e (a service over
// internal/kubeevents' store). Call before Handler.
func (s *Server) SetEvents(e api.EventRoutes) { s.events = e }
