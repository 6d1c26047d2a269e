package agentbox

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// SandboxEvent is one sandbox lifecycle event (E2B's events API): created,
// updated, paused, resumed, checkpointed, killed, or agentbox's
// sandbox.policy.violation.
type SandboxEvent struct {
	Version            string         `json:"version"`
	ID                 string         `json:"id"`
	Type               string         `json:"type"`
	EventData          map[string]any `json:"eventData"`
	SandboxBuildID     string         `json:"sandboxBuildId"`
	SandboxExecutionID string         `json:"sandboxExecutionId"`
	SandboxID          string         `json:"sandboxId"`
	SandboxTeamID      string         `json:"sandboxTeamId"`
	SandboxTemplateID  string         `json:"sandboxTemplateId"`
	Timestamp          time.Time      `json:"timestamp"`
}

// EventsOptions selects events. Zero fields take the server's defaults
// (newest first, 10 events).
type EventsOptions struct {
	Types    []string // only these types
	Offset   int      // events to skip
	Limit    int      // 1 to 100
	OrderAsc bool     // oldest first
}

// SandboxEvents returns the lifecycle events of sandbox id ("" = every
// sandbox of the team), which outlive the sandbox.
func (c *Client) SandboxEvents(ctx context.Context, id string, opts EventsOptions) ([]SandboxEvent, error) {
	q := url.Values{}
	for _, t := range opts.Types {
		q.Add("types", t)
	}
	if opts.Offset > 0 {
		q.Set("offset", strconv.Itoa(opts.Offset))
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.OrderAsc {
		q.Set("orderAsc", "true")
	}
	path := "/events/sandboxes"
	if id != "" {
		path += "/" + url.PathEscape(id)
	}
	var out []SandboxEvent
	if _, err := c.do(ctx, http.MethodGet, path+"?"+q.Encode(), nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out, nil
}
