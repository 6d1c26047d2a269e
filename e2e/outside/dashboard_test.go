package outside

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestDashboardAttacks: the dashboard's bridge to a sandbox (terminal over
// WebSocket, file list, download and upload) is refused to another team
// (404, as for a sandbox that does not exist), to a missing or wrong key
// (401), and to a page of another origin (403). Team A's own key opens the
// terminal, so the refusals are not a broken route.
func TestDashboardAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)
	const unknown = "i0000000000000000000"
	wsURL := "ws" + strings.TrimPrefix(s.URL, "http") + "/dashboard/api/sandboxes/%s/terminal"

	// terminal dials the terminal; it returns the HTTP status of a refusal
	// (0 when the upgrade succeeded) and, on success, the output of a command.
	terminal := func(sandbox, key string, header http.Header) (int, string, error) {
		opts := &websocket.DialOptions{Subprotocols: []string{"agentbox.terminal"}, HTTPHeader: header}
		if key != "" {
			opts.Subprotocols = append(opts.Subprotocols, "agentbox.key."+key)
		}
		c, resp, err := websocket.Dial(ctx, fmt.Sprintf(wsURL, sandbox), opts)
		if err != nil {
			if resp != nil {
				return resp.StatusCode, "", nil
			}
			return 0, "", err
		}
		defer c.CloseNow()
		if err := c.Write(ctx, websocket.MessageBinary, []byte("echo dash-$((40+2))\n")); err != nil {
			return 0, "", err
		}
		var out bytes.Buffer
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		for !strings.Contains(out.String(), "dash-42") {
			_, msg, err := c.Read(rctx)
			if err != nil {
				return 0, out.String(), nil
			}
			out.Write(msg)
		}
		return 0, out.String(), nil
	}

	// The control: team A's key, no Origin (not a browser), opens a shell.
	if st, out, err := terminal(id, s.APIKey, nil); err != nil || st != 0 || !strings.Contains(out, "dash-42") {
		t.Fatalf("team A's own terminal: status %d, output %q, err %v", st, out, err)
	}

	files := []struct{ method, path string }{
		{http.MethodGet, "/dashboard/api/sandboxes/%s/dir?path=/etc"},
		{http.MethodGet, "/dashboard/api/sandboxes/%s/files?path=/etc/hostname"},
		{http.MethodPost, "/dashboard/api/sandboxes/%s/files?path=/tmp/planted"},
	}
	var attacks []attack
	for _, f := range files {
		attacks = append(attacks, attack{
			side: sideTenant,
			name: "other team dashboard " + f.method + " " + strings.SplitN(fmt.Sprintf(f.path, "{id}"), "?", 2)[0],
			run: func(t *testing.T) error {
				st, b, err := s.Do(ctx, s.OtherKey, f.method, fmt.Sprintf(f.path, id), "planted")
				if err != nil {
					return err
				}
				ust, ub, err := s.Do(ctx, s.OtherKey, f.method, fmt.Sprintf(f.path, unknown), "planted")
				if err != nil {
					return err
				}
				switch {
				case st != http.StatusNotFound:
					return crossed("answered %d (not 404): %.100s", st, b)
				case ust != st || !bytes.Equal(bytes.ReplaceAll(b, []byte(id), []byte(unknown)), ub):
					return crossed("existence oracle: %d %q for team A's sandbox, %d %q for none", st, b, ust, ub)
				}
				return nil
			},
		})
	}
	attacks = append(attacks,
		attack{side: sideTenant, name: "other team opens the dashboard terminal", run: func(t *testing.T) error {
			for _, how := range []struct {
				name   string
				key    string
				header http.Header
			}{
				{"key as subprotocol", s.OtherKey, nil},
				{"key as header", "", http.Header{"X-API-Key": {s.OtherKey}}},
			} {
				st, out, err := terminal(id, how.key, how.header)
				if err != nil {
					return fmt.Errorf("%s: %w", how.name, err)
				}
				if st != http.StatusNotFound {
					return crossed("%s: answered %d (not 404), output %.80q", how.name, st, out)
				}
			}
			return nil
		}},
		attack{side: sideTenant, name: "dashboard terminal and files without a key or with a wrong key", run: func(t *testing.T) error {
			for _, key := range []string{"", "e2b_" + strings.Repeat("0", 40)} {
				if st, out, err := terminal(id, key, nil); err != nil {
					return err
				} else if st != http.StatusUnauthorized {
					return crossed("terminal with key %q: answered %d (not 401), output %.80q", key, st, out)
				}
				st, b, err := s.Do(ctx, key, http.MethodGet, "/dashboard/api/sandboxes/"+id+"/files?path=/etc/hostname", nil)
				if err != nil {
					return err
				}
				if st != http.StatusUnauthorized {
					return crossed("download with key %q: answered %d (not 401): %.80s", key, st, b)
				}
			}
			return nil
		}},
		attack{side: sideTenant, name: "page of another origin opens the dashboard terminal with a leaked key", run: func(t *testing.T) error {
			st, out, err := terminal(id, s.APIKey, http.Header{"Origin": {"http://evil.example"}})
			if err != nil {
				return err
			}
			if st != http.StatusForbidden {
				return crossed("answered %d (not 403), output %.80q", st, out)
			}
			return nil
		}},
	)
	runAttacks(t, attacks)
}
