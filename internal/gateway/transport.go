package gateway

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// boots is the proxy's transport: one connection pool per sandbox boot. A
// sandbox that boots again (a resume from its files) is a new network
// stack behind the same address; under gVisor the old one vanished
// without closing its connections, so a kept-alive one would carry the
// next request into a reset (a 502 right after the resume). A new boot
// gets a new pool, and the old one is closed.
type boots struct {
	res   Resolver
	mu    sync.Mutex
	pools map[string]bootPool // by sandbox id
}

type bootPool struct {
	boot string
	tr   *http.Transport
}

func newBoots(res Resolver) *boots {
	return &boots{res: res, pools: map[string]bootPool{}}
}

func newTransport() *http.Transport {
	return &http.Transport{
		// Never via an HTTP proxy from the environment: targets are local.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// Compression is the client's business; pass bytes through untouched.
		DisableCompression: true,
		// httpsPorts: servers inside sandboxes use self-signed certificates.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}
}

// RoundTrip sends r over the pool of its target's boot.
func (b *boots) RoundTrip(r *http.Request) (*http.Response, error) {
	t := r.Context().Value(targetKey{}).(target)
	return b.pool(t.id, t.boot).RoundTrip(r)
}

// pool returns the transport of sandbox id's boot, replacing (and
// closing) the pool of an earlier boot. A new pool also closes those of
// sandboxes that are gone, so the map holds live sandboxes only.
func (b *boots) pool(id, boot string) *http.Transport {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.pools[id]
	if ok && p.boot == boot {
		return p.tr
	}
	if ok {
		p.tr.CloseIdleConnections()
	}
	for other, op := range b.pools {
		if _, live := b.res.Lookup(other); !live && other != id {
			op.tr.CloseIdleConnections()
			delete(b.pools, other)
		}
	}
	p = bootPool{boot: boot, tr: newTransport()}
	b.pools[id] = p
	return p.tr
}
