package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// bridgePorts lists the interfaces on the server's bridge: a sandbox's
// host veth while it lives.
func bridgePorts(s *server) map[string]bool {
	ents, _ := os.ReadDir(filepath.Join("/sys/class/net", s.Bridge, "brif"))
	out := map[string]bool{}
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

// TestBurstNeverFailsNorLeaks sends a burst of creates at once: every one
// succeeds and answers; then half are killed, the server is SIGKILLed and
// started again, the rest are killed, and nothing of any of them is left
// on the host: no mount, netns, runc container, cgroup or bridge port.
func TestBurstNeverFailsNorLeaks(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := s.client()
	before := bridgePorts(s)

	const n = 12
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"e2e": "burst"}})
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = sb.SandboxID
			r, err := c.Run(ctx, sb, "user", "echo ok")
			if err == nil && r.Stdout != "ok\n" {
				t.Errorf("sandbox %s: echo ok printed %q", sb.SandboxID, r.Stdout)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	defer func() {
		for _, id := range ids {
			if id != "" {
				_ = s.client().Kill(context.Background(), id)
			}
		}
	}()
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d of a burst of %d: %v", i, n, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// The port check below must see live sandboxes, else it proves nothing.
	if got := len(bridgePorts(s)) - len(before); got < n {
		t.Fatalf("%d new ports on bridge %s with %d sandboxes running, want %d", got, s.Bridge, n, n)
	}

	for _, id := range ids[:n/2] {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
	}
	s.Kill9(t)
	s.Launch(t)
	c = s.client()
	for _, id := range ids[n/2:] {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatalf("kill %s after restart: %v", id, err)
		}
	}
	for _, id := range ids {
		if _, err := c.Get(ctx, id); !wire.IsStatus(err, 404) {
			t.Errorf("get %s after kill: %v, want 404", id, err)
		}
		assertNoLeaks(t, s, id)
	}
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		left = left[:0]
		for p := range bridgePorts(s) {
			if !before[p] {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("every sandbox of the burst killed, but bridge %s keeps ports %v", s.Bridge, left)
	}
}
