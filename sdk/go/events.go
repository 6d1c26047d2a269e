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

// IncompleteHeader is the header a server sets on an events answer that
// lacks some events it could not read (on a cluster, node agents that
// did not answer); its value says how many are missing and why.
const IncompleteHeader = "Agentbox-Events-Incomplete"

// EventsPage is one answer of the events API: the events, and what the
// server could not read for it ("" when the answer is whole).
type EventsPage struct {
	Events     []SandboxEvent
	Incomplete string
}

// SandboxEvents returns the lifecycle events of sandbox id ("" = every
// sandbox of the team), which outlive the sandbox. SandboxEventsPage also
// says when the answer is incomplete.
func (c *Client) SandboxEvents(ctx context.Context, id string, opts EventsOptions) ([]SandboxEvent, error) {
	p, err := c.SandboxEventsPage(ctx, id, opts)
	return p.Events, err
}

// SandboxEventsPage is SandboxEvents with the server's word on what the
// answer lacks.
func (c *Client) SandboxEventsPage(ctx context.Context, id string, opts EventsOptions) (EventsPage, error) {
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
	resp, err := c.do(ctx, http.MethodGet, path+"?"+q.Encode(), nil, &out, http.StatusOK)
	if err != nil {
		return EventsPage{}, err
	}
	return EventsPage{Events: out, Incomplete: resp.Header.Get(IncompleteHeader)}, nil
}
