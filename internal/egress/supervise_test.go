package egress

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/network"
)

// A proxy listener that dies under the running server is opened again on
// the same port: the sandbox's egress comes back without a new policy.
func TestProxyListenerRecovers(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	c := e.client(e.fake.CAPool)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last error
	ok := func() bool {
		r, _, err := e.get(t, c, "http://allowed.test/hello")
		if last = err; err == nil && r.StatusCode != http.StatusOK {
			last = errors.New(r.Status)
		}
		return last == nil
	}
	for !ok() { // a new veth may take a moment to pass its first packet
		select {
		case <-ctx.Done():
			t.Fatalf("no egress before the fault: %v", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for i := 1; i <= 3; i++ { // more than once: each new listener is supervised too
		e.eg.FailProxy()
		for e.eg.ProxyRestarts() < i || !ok() {
			select {
			case <-ctx.Done():
				t.Fatalf("egress did not come back after the proxy listener died (%d restarts): %v", e.eg.ProxyRestarts(), last)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
