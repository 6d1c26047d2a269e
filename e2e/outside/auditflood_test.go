package outside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// sweepScript is run by python3 in a sandbox with the internet off: a
// connect to each of 2,000 ports of one address, then to 500 addresses of
// 198.18.0.0/16, with one connect to the needle in the middle of the
// ports. Every one is refused in the kernel at its SYN and logged there.
const sweepScript = `import socket
def c(a, p):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((a, p)); return "connected"
    except OSError as e:
        return e.errno
    finally:
        s.close()
refused, needle = 0, None
for p in range(1, 2001):
    if p == 1000:
        needle = c("203.0.113.9", 443)
    refused += c("198.18.7.10", p) != "connected"
for i in range(500):
    refused += c("198.18.%d.%d" % (8 + i // 250, 1 + i % 250), 80) != "connected"
print("refused", refused, needle)
`

// TestAuditFloodAttacks: a sandbox sweeping thousands of distinct
// destinations (the ports of one address, the addresses of a range)
// cannot push the one connection that matters out of the audit trail, and
// the sweep itself is counted, not lost.
func TestAuditFloodAttacks(t *testing.T) {
	harness.RequireRoot(t)
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const flood, needle = 2500, "203.0.113.9:443"
	sweep := netip.MustParsePrefix("198.18.0.0/16")

	runAttacks(t, []attack{
		{side: sideSandboxProxy, name: "a sweep of 2,500 distinct destinations hides another connection in the audit", run: func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300, "allow_internet_access": false})
			if err != nil || st != http.StatusCreated {
				return fmt.Errorf("create sandbox: %d %s %v", st, b, err)
			}
			id := jsonField(t, b, "sandboxID")
			t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
			client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithAPIKey(s.APIKey), agentbox.WithSandboxURL(s.URL))
			sb, err := client.Connect(ctx, id, 5*time.Minute)
			if err != nil {
				return err
			}
			if _, err := sb.Files.Write(ctx, "/tmp/sweep.py", []byte(sweepScript)); err != nil {
				return err
			}
			r, err := sb.Commands.Run(ctx, "python3 /tmp/sweep.py", agentbox.WithTimeout(3*time.Minute))
			if err != nil {
				return fmt.Errorf("run the sweep: %w", err)
			}
			// 111: ECONNREFUSED, the policy's reset.
			if out := strings.TrimSpace(r.Stdout + r.Stderr); out != fmt.Sprintf("refused %d 111", flood) {
				return fmt.Errorf("the sweep did not run as planned: %q", out)
			}

			// The rows over the audit rate come every few seconds: wait
			// until the needle is named and the sweep counted whole, or
			// until they surely would have been.
			var swept int64
			var rows int
			var named string
			deadline := time.Now().Add(30 * time.Second)
			for {
				swept, rows, named = 0, 0, ""
				st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes/"+id+"/logs?kind=egress&limit=10000", nil)
				if err != nil || st != http.StatusOK {
					return fmt.Errorf("audit log: %d %s %v", st, b, err)
				}
				var logs struct {
					Logs []struct {
						Fields map[string]string `json:"fields"`
					} `json:"logs"`
				}
				if err := json.Unmarshal(b, &logs); err != nil {
					return err
				}
				for _, l := range logs.Logs {
					f := l.Fields
					rows++
					n := int64(1)
					if f["action"] == "suppressed" {
						n, _ = strconv.ParseInt(f["count"], 10, 64)
					}
					var members []string
					_ = json.Unmarshal([]byte(f["members"]), &members)
					if f["decision"] == "denied" && (f["dst"] == needle || slices.Contains(members, needle)) && named == "" {
						named = fmt.Sprintf("%s row %s %s", f["action"], f["fold"], f["dst"])
					}
					if inside(f, sweep) {
						swept += n
					}
				}
				if (named != "" && swept >= flood) || time.Now().After(deadline) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			switch {
			case named == "":
				return crossed("the denied connection to %s is not named in the audit (%d rows; the sweep counted %d times)", needle, rows, swept)
			case swept < flood:
				return crossed("the audit counts %d of the sweep's %d connections inside %s", swept, flood, sweep)
			case rows > 1000:
				return fmt.Errorf("the sweep took %d audit rows; the rate should bound it", rows)
			}
			t.Logf("audit: %d rows; the needle in a %s, the sweep counted %d times", rows, named, swept)
			return nil
		}},
	})
}

// inside reports whether an audit row stands for destinations of p alone:
// its prefix, address or address:port lies in p.
func inside(f map[string]string, p netip.Prefix) bool {
	if s := f["prefix"]; s != "" {
		rp, err := netip.ParsePrefix(s)
		return err == nil && rp.Bits() >= p.Bits() && p.Contains(rp.Addr())
	}
	if ap, err := netip.ParseAddrPort(f["dst"]); err == nil {
		return p.Contains(ap.Addr())
	}
	a, err := netip.ParseAddr(f["dst"])
	return err == nil && p.Contains(a)
}
