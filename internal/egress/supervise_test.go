package egress

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/network"
)

// The proxy's and the resolver's sockets that die under the running
// server are opened again on the same ports: the sandbox's egress and name
// resolution come back without a new policy.
func TestProxyListenerRecovers(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	c := e.client(e.fake.CAPool)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last error
	ok := func() bool {
		// The client resolves over UDP at the gateway, then connects.
		r, _, err := e.get(t, c, "http://allowed.test/hello")
		if last = err; err == nil && r.StatusCode != http.StatusOK {
			last = errors.New(r.Status)
		}
		if last == nil {
			last = e.resolveTCP("allowed.test")
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

// resolveTCP asks the resolver at the gateway over TCP for name: any
// answer (the fake internet's nameserver answers UDP only, so the upstream
// answer is a failure) shows the listener serves.
func (e *env) resolveTCP(name string) error {
	_, err := e.query("tcp4", net.JoinHostPort(e.nw.Gateway().String(), "53"), name)
	return err
}
