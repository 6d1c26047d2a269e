package outside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// dnsProbe is a python3 script run in a sandbox: one A query for argv[2]
// to the nameserver argv[1] ("resolv" for the sandbox's own) over argv[3]
// (udp or tcp). It prints "rcode N ANCOUNT", "noanswer" or "error ERRNO".
const dnsProbe = `import socket, struct, sys
ns, name, proto = sys.argv[1], sys.argv[2], sys.argv[3]
if ns == "resolv":
    ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
for label in name.split("."):
    q += bytes([len(label)]) + label.encode()
q += b"\x00" + struct.pack(">HH", 1, 1)
try:
    if proto == "tcp":
        s = socket.create_connection((ns, 53), timeout=3)
        s.sendall(struct.pack(">H", len(q)) + q)
        r = s.recv(2)
        r = s.recv(struct.unpack(">H", r)[0]) if len(r) == 2 else b""
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.connect((ns, 53))
        r = b""
        for _ in range(3):  # the kernel rate-limits ICMP errors: a refusal may need a second try
            s.send(q)
            try:
                r = s.recv(1500); break
            except socket.timeout:
                continue
    if len(r) < 12:
        print("noanswer")
    else:
        print("rcode", r[3] & 15, struct.unpack(">H", r[6:8])[0])
except OSError as e:
    print("error", e.errno)
`

// TestDenyAllAttacks: deny-all looks like deny-all, DNS included (a
// sandbox with the internet off and no allowed name resolves nothing and
// reaches no nameserver of its choice; one with allowed names resolves
// only those), and the egress audit of a flood still names every other
// destination.
func TestDenyAllAttacks(t *testing.T) {
	harness.RequireRoot(t)
	fake := testutil.NewFakeNet(t, "edeny", netip.MustParsePrefix("198.18.6.0/24"), 2, map[string]netip.Addr{
		"allowed.test": netip.MustParseAddr("198.18.6.10"),
		"other.test":   netip.MustParseAddr("198.18.6.11"),
	})
	outsideNS := fake.DNS.String()
	s := harness.Start(t, harness.Name("deny-all"), harness.Args("--egress-dns", outsideNS))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithAPIKey(s.APIKey), agentbox.WithSandboxURL(s.URL))
	create := func(t *testing.T, body map[string]any) *agentbox.Sandbox {
		t.Helper()
		body["templateID"], body["timeout"] = "base", 600
		st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", body)
		if err != nil || st != http.StatusCreated {
			t.Fatalf("create sandbox: %d %s %v", st, b, err)
		}
		id := jsonField(t, b, "sandboxID")
		t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
		sb, err := client.Connect(ctx, id, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Files.Write(ctx, "/tmp/dnsprobe.py", []byte(dnsProbe)); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	sh := func(t *testing.T, sb *agentbox.Sandbox, cmd string) string {
		t.Helper()
		r, err := sb.Commands.Run(ctx, cmd+"; true", agentbox.WithTimeout(3*time.Minute))
		if err != nil {
			t.Fatalf("run %q: %v", cmd, err)
		}
		return strings.TrimSpace(r.Stdout + r.Stderr)
	}
	dns := func(t *testing.T, sb *agentbox.Sandbox, ns, name, proto string) string {
		return sh(t, sb, fmt.Sprintf("python3 /tmp/dnsprobe.py %s %s %s", ns, name, proto))
	}

	denyAll := create(t, map[string]any{"allow_internet_access": false})
	named := create(t, map[string]any{"allow_internet_access": false, "network": map[string]any{"allowOut": []string{"allowed.test"}}})
	// The control: the outside nameserver answers allowed.test for a
	// sandbox the policy lets resolve it, so a refusal below is the
	// policy's doing.
	if out := dns(t, named, "resolv", "allowed.test", "udp"); out != "rcode 0 1" {
		t.Fatalf("control: allowed.test through the sandbox's resolver: %q", out)
	}

	runAttacks(t, []attack{
		{side: sideSandboxResolver, name: "deny-all: the sandbox's resolver answers a name", run: func(t *testing.T) error {
			for _, proto := range []string{"udp", "tcp"} {
				for _, name := range []string{"allowed.test", "other.test", "example.com"} {
					out := dns(t, denyAll, "resolv", name, proto)
					if out != "rcode 5 0" && out != "noanswer" {
						return crossed("%s %s: %q; deny-all must refuse every name (REFUSED, rcode 5) or not answer", proto, name, out)
					}
				}
			}
			return nil
		}},
		{side: sideSandboxResolver, name: "deny-all: a query to a nameserver of the sandbox's choice", run: func(t *testing.T) error {
			for _, ns := range []string{outsideNS, "198.18.6.11"} {
				if out := dns(t, denyAll, ns, "allowed.test", "udp"); out != "error 111" && out != "error 113" {
					return crossed("UDP to %s:53: %q, want a refusal like any denied destination (error 111 or 113)", ns, out)
				}
				if out := dns(t, denyAll, ns, "allowed.test", "tcp"); out != "error 111" {
					return crossed("TCP to %s:53: %q, want ECONNREFUSED (error 111) like any denied destination", ns, out)
				}
			}
			return nil
		}},
		{side: sideSandboxResolver, name: "allowed names: another name resolves", run: func(t *testing.T) error {
			for _, proto := range []string{"udp", "tcp"} {
				for _, name := range []string{"other.test", "example.com"} {
					out := dns(t, named, "resolv", name, proto)
					if strings.HasPrefix(out, "rcode 0") {
						return crossed("%s %s resolved: %q", proto, name, out)
					}
				}
			}
			if out := dns(t, named, outsideNS, "other.test", "tcp"); out != "error 111" {
				return crossed("TCP to the outside nameserver: %q, want ECONNREFUSED", out)
			}
			return nil
		}},
		{side: sideSandboxProxy, name: "a flood of 10,000 denied connections hides another in the audit", run: func(t *testing.T) error {
			flooder := create(t, map[string]any{"allow_internet_access": false})
			const flood, floodDst, otherDst = 10000, "198.18.6.10:7", "198.18.6.11:22"
			// The one that matters goes in the middle of the flood, when
			// the audit rate is long spent.
			out := sh(t, flooder, `python3 -c "
import socket
refused, other = 0, None
for i in range(`+strconv.Itoa(flood)+`):
    if i == `+strconv.Itoa(flood/2)+`:
        s = socket.socket()
        try:
            s.connect(('198.18.6.11', 22)); other = 'connected'
        except OSError as e:
            other = e.errno
        s.close()
    s = socket.socket()
    try:
        s.connect(('198.18.6.10', 7))
    except OSError:
        refused += 1
    s.close()
print('refused', refused, other)"`)
			if !strings.HasPrefix(out, fmt.Sprintf("refused %d ", flood)) {
				return fmt.Errorf("the flood did not run as planned: %q", out)
			}
			var floodCount, otherCount int64
			var rows int
			deadline := time.Now().Add(30 * time.Second)
			for {
				floodCount, otherCount, rows = 0, 0, 0
				st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes/"+flooder.ID+"/logs?kind=egress&limit=10000", nil)
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
					rows++
					n := int64(1)
					if l.Fields["action"] == "suppressed" {
						n, _ = strconv.ParseInt(l.Fields["count"], 10, 64)
					}
					switch l.Fields["dst"] {
					case floodDst:
						floodCount += n
					case otherDst:
						otherCount += n
					}
				}
				if (otherCount > 0 && floodCount >= flood) || time.Now().After(deadline) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			switch {
			case otherCount == 0:
				return crossed("the connection to %s is not in the audit (%d rows, the flood's count %d)", otherDst, rows, floodCount)
			case floodCount < flood:
				return crossed("the audit counts %d of the %d connections to %s", floodCount, flood, floodDst)
			case rows > 1000:
				return fmt.Errorf("the flood took %d audit rows; the rate should bound it", rows)
			}
			t.Logf("audit: %d rows; %s counted %d times, %s %d", rows, floodDst, floodCount, otherDst, otherCount)
			return nil
		}},
	})
}
