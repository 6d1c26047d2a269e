package gateway

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"github.com/agentbox/agentbox/internal/httperr"
)

// Defaults of Limits.
const (
	DefaultMaxPerClient  = 1024
	DefaultMaxPerSandbox = 512
)

// Limits bound what the gateway holds open: proxied requests under way
// (streams, WebSockets and file transfers included) and port-forward
// tunnels, counted per client address and per sandbox. Each holds at most
// one copy buffer per direction of a fixed size (the proxy's pool, 256 KiB;
// 32 KiB for upgraded and tunnelled streams), so these also bound the
// gateway's buffer memory.
type Limits struct {
	// PerClient is the most one client address (authlimit's: an IPv4
	// address or IPv6 /64, behind --trusted-proxy the forwarded one) may
	// hold at once [DefaultMaxPerClient]; past it, 429.
	PerClient int
	// PerSandbox is the most one sandbox may be sent at once
	// [DefaultMaxPerSandbox]; past it, 503.
	PerSandbox int
}

// SetLimits sets the gateway's connection bounds; call before serving.
func (g *Gateway) SetLimits(l Limits) { g.conns.limits = l }

// conns counts what the gateway holds open, in one place for the proxy
// and the tunnels.
type conns struct {
	mu      sync.Mutex
	limits  Limits
	client  map[netip.Prefix]int
	sandbox map[string]int
}

// hold counts one request or tunnel of r's client to sandbox id until
// release is called. Past a bound it answers r itself and returns false.
func (g *Gateway) hold(w http.ResponseWriter, r *http.Request, id string) (release func(), ok bool) {
	client := g.guesses.Client(r)
	c := &g.conns
	c.mu.Lock()
	perClient, perSandbox := c.limits.PerClient, c.limits.PerSandbox
	if perClient <= 0 {
		perClient = DefaultMaxPerClient
	}
	if perSandbox <= 0 {
		perSandbox = DefaultMaxPerSandbox
	}
	if c.client == nil {
		c.client, c.sandbox = map[netip.Prefix]int{}, map[string]int{}
	}
	nc, ns := c.client[client], c.sandbox[id]
	if nc >= perClient || ns >= perSandbox {
		c.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		if nc >= perClient {
			httperr.WriteJSON(w, http.StatusTooManyRequests, map[string]any{"code": http.StatusTooManyRequests, "sandboxId": id,
				"message": fmt.Sprintf("%s has %d requests and tunnels under way through the gateway, the most this server allows one client address (agentbox serve --gateway-max-per-client); retry when some end", client, nc)})
		} else {
			httperr.WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"code": http.StatusServiceUnavailable, "sandboxId": id,
				"message": "sandbox " + id + " has " + strconv.Itoa(ns) + " requests and tunnels under way, the most this server allows one sandbox (agentbox serve --gateway-max-per-sandbox); retry when some end"})
		}
		return nil, false
	}
	c.client[client], c.sandbox[id] = nc+1, ns+1
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.client[client]--; c.client[client] <= 0 {
				delete(c.client, client)
			}
			if c.sandbox[id]--; c.sandbox[id] <= 0 {
				delete(c.sandbox, id)
			}
		})
	}, true
}
