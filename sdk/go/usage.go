package agentbox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
)

// TeamUsage is the calling team's metered usage over a window.
type TeamUsage = rest.TeamUsage

// Usage returns the calling team's usage between from and to; a zero from
// or to takes the server's default (30 days before to; now).
func (c *Client) Usage(ctx context.Context, from, to time.Time) (*TeamUsage, error) {
	q := url.Values{}
	if !from.IsZero() {
		q.Set("from", from.Format(time.RFC3339Nano))
	}
	if !to.IsZero() {
		q.Set("to", to.Format(time.RFC3339Nano))
	}
	path := "/usage"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var u TeamUsage
	if _, err := c.do(ctx, http.MethodGet, path, nil, &u, http.StatusOK); err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return &u, nil
}
