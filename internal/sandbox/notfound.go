package sandbox

import (
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// NotFound is the answer for an id the caller has no sandbox by, whether
// it is unknown or another team's (E2B's words): every backend of the API
// says it alike, so an answer tells nothing of other teams.
func NotFound(id string) error {
	return fmt.Errorf("Sandbox %q doesn't exist or you don't have access to it: %w", id, errdefs.ErrNotFound)
}
