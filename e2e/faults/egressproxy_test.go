package faults

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestDyingEgressProxy closes the egress proxy's listener under the running
// server again and again (--test-fail-egress-proxy): the server listens
// again on the same port, so a running sandbox keeps its egress (a
// request made after each fault arrives) and its health stays ok.
func TestDyingEgressProxy(t *testing.T) {
	harness.RequireRoot(t)
	fake := testutil.NewFakeNet(t, "efp", netip.MustParsePrefix("198.18.7.0/24"), 3, map[string]netip.Addr{
		"allowed.test": netip.MustParseAddr("198.18.7.10"),
	})
	caFile := filepath.Join(t.TempDir(), "fake-ca.pem")
	if err := os.WriteFile(caFile, fake.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	s := harness.Start(t, harness.Name("faults-egress"), harness.Args("--egress-dns", fake.DNS.String(), "--egress-ca-file", caFile,
		"--test-fail-egress-proxy", "2s", "--health-interval", "1s"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	sb := create(ctx, t, s, "container")
	defer func() { _ = c.Kill(context.Background(), sb.SandboxID) }()

	// faults counts the faults the server's log shows so far.
	faults := func() int {
		b, err := os.ReadFile(s.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "test fault: closing the egress proxy's listener")
	}
	arrived := func(path string) bool {
		for _, r := range fake.Requests() {
			if r.Path == path {
				return true
			}
		}
		return false
	}
	for round := range 3 {
		// Wait for a fault after the last request, then ask again: the
		// request must reach the fake internet through the new listener.
		// curl retries a refused connection: one made in the instant the
		// listener is down is refused, not lost.
		seen := faults()
		for faults() <= seen {
			select {
			case <-ctx.Done():
				t.Fatalf("the server logged no egress fault after %d", seen)
			case <-time.After(100 * time.Millisecond):
			}
		}
		path := fmt.Sprintf("/after-fault-%d", round)
		r, err := c.Run(ctx, sb, "", "curl -sS -m 10 --retry 5 --retry-connrefused --retry-delay 1 http://allowed.test"+path)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !arrived(path) {
			t.Fatalf("round %d: the sandbox lost its egress after the proxy's listener died: %+v\n%s", round, r, s.LogTail(20))
		}
		if _, in := getInfo(ctx, t, s, sb.SandboxID); in.Health == "error" {
			t.Fatalf("round %d: the sandbox shows health error (%s) although its egress works", round, in.HealthReason)
		}
	}
}
