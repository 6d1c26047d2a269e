package api

import (
	"net/http"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// resumeWith resumes the request's sandbox with its memory, or from its
// files only when memory is false (E2B's connect/resume "memory": false).
func (s *Server) resumeWith(r *http.Request, memory *bool, d time.Duration) (*sandbox.Sandbox, bool, error) {
	return s.be.Resume(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), d, memory == nil || *memory)
}
