package agentbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
)

// LogEntry is one audit event of a sandbox: a lifecycle change, a process
// start or exit, a file change through the API, an egress decision or a
// limit hit. Fields hold its details (kind, action, decision, reason, cmd,
// pid, exitCode, path, ...) as strings.
type LogEntry = rest.SandboxLogEntry

// LogsOptions filter Logs and FollowLogs.
type LogsOptions struct {
	Since time.Time // only events at or after this time
	Limit int       // the newest Limit events (server default 1000)
	Kinds []string  // lifecycle, process, file, egress, limit, syscall; empty = all
}

func (o LogsOptions) query() url.Values {
	q := url.Values{}
	if !o.Since.IsZero() {
		q.Set("cursor", strconv.FormatInt(o.Since.UnixMilli(), 10))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if len(o.Kinds) > 0 {
		q.Set("kind", strings.Join(o.Kinds, ","))
	}
	return q
}

// Logs returns the sandbox's audit log, oldest first. It stays readable
// after the sandbox is gone.
func (c *Client) Logs(ctx context.Context, id string, opts LogsOptions) ([]LogEntry, error) {
	var out rest.SandboxLogsV2
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/logs?" + opts.query().Encode()
	if _, err := c.do(ctx, http.MethodGet, path, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Logs, nil
}

// FollowLogs calls fn with the stored events and then with every new one
// as it happens, until ctx ends, fn returns an error, or the server closes
// the stream.
func (c *Client) FollowLogs(ctx context.Context, id string, opts LogsOptions, fn func(LogEntry) error) error {
	q := opts.query()
	q.Set("follow", "true")
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/logs?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.apiURL+path, nil)
	if err != nil {
		return err
	}
	if c.apiKey != "" {
		req.Header.Set("X-API-Key", c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("follow logs of %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decodeAPIError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue // keepalive
		}
		var e LogEntry
		if err := json.Unmarshal(line, &e); err != nil {
			return fmt.Errorf("follow logs of %s: %w", id, err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("follow logs of %s: %w", id, err)
	}
	return nil
}
