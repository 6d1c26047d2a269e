// Package authlimit slows down credential guessing: it counts the failed
// authentications of each client address (API keys, sandbox access and
// traffic tokens, signed file URLs) and, past a burst, refuses that
// address's authentication attempts with 429 and Retry-After until its
// allowance refills. Other addresses are never affected, and a client
// whose credential is valid is never counted. Memory is bounded: at most
// MaxClients addresses are tracked, least recently failed first out.
package authlimit

import (
	"container/list"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options tune a Limiter; zero fields take the defaults in brackets.
type Options struct {
	// Burst is how many failures an address may have in a row [20].
	Burst int
	// Refill is how often one more failure is allowed back [3s], i.e. a
	// sustained 20 guesses a minute.
	Refill time.Duration
	// MaxClients bounds the addresses tracked [65536].
	MaxClients int
	// TrustedProxies are the reverse proxies in front of the server: for a
	// request from one of them the client is the last X-Forwarded-For
	// entry that is not itself a trusted proxy. From anyone else the
	// header is ignored (it would let a guesser pose as any address).
	TrustedProxies []netip.Prefix
	// Now is the clock [time.Now].
	Now func() time.Time
}

// Limiter counts failed authentications per client. Safe for concurrent
// use; the zero value is not usable, call New.
type Limiter struct {
	opts Options

	mu      sync.Mutex
	clients map[netip.Prefix]*list.Element // of *bucket
	lru     list.List                      // front: most recently failed
}

type bucket struct {
	key    netip.Prefix
	tokens float64 // failures still allowed
	at     time.Time
	failed int // failures since the bucket was last full, for the message
}

// New returns a Limiter.
func New(opts Options) *Limiter {
	if opts.Burst <= 0 {
		opts.Burst = 20
	}
	if opts.Refill <= 0 {
		opts.Refill = 3 * time.Second
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = 65536
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Limiter{opts: opts, clients: map[netip.Prefix]*list.Element{}}
}

// Client is the address r is counted under: its peer, or behind a trusted
// proxy the client X-Forwarded-For names. IPv6 clients are counted per /64,
// the block one host is usually given.
func (l *Limiter) Client(r *http.Request) netip.Prefix {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	var addr netip.Addr
	if err == nil {
		addr = ap.Addr().Unmap()
	} else if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		addr, _ = netip.ParseAddr(host)
	}
	if addr.IsValid() && l.trusted(addr) {
		hops := r.Header.Values("X-Forwarded-For")
		var all []string
		for _, h := range hops {
			all = append(all, strings.Split(h, ",")...)
		}
		for i := len(all) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(all[i]))
			if err != nil {
				break
			}
			addr = a.Unmap()
			if !l.trusted(addr) {
				break
			}
		}
	}
	if !addr.IsValid() {
		return netip.Prefix{}
	}
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}

func (l *Limiter) trusted(a netip.Addr) bool {
	for _, p := range l.opts.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// refill brings b's allowance up to now; the caller holds l.mu.
func (l *Limiter) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = math.Min(float64(l.opts.Burst), b.tokens+float64(d)/float64(l.opts.Refill))
		b.at = now
	}
	if b.tokens >= float64(l.opts.Burst) {
		b.failed = 0
	}
}

// Check reports whether client may try to authenticate now; when it may
// not, wait is how long until it may and failed how many failures got it
// there.
func (l *Limiter) Check(client netip.Prefix) (wait time.Duration, failed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, found := l.clients[client]
	if !found {
		return 0, 0, true
	}
	b := e.Value.(*bucket)
	l.refill(b, l.opts.Now())
	if b.tokens >= 1 {
		return 0, b.failed, true
	}
	return time.Duration((1 - b.tokens) * float64(l.opts.Refill)), b.failed, false
}

// Fail counts one failed authentication of client.
func (l *Limiter) Fail(client netip.Prefix) {
	now := l.opts.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e, found := l.clients[client]
	if !found {
		if l.lru.Len() >= l.opts.MaxClients {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.clients, old.Value.(*bucket).key)
		}
		e = l.lru.PushFront(&bucket{key: client, tokens: float64(l.opts.Burst), at: now})
		l.clients[client] = e
	}
	b := e.Value.(*bucket)
	l.refill(b, now)
	b.tokens = math.Max(0, b.tokens-1)
	b.failed++
	l.lru.MoveToFront(e)
}

// Tracked is how many addresses the limiter holds.
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// Refuse writes the 429 for a client Check refused: E2B's error shape, a
// Retry-After in whole seconds, and a message saying why. what names the
// credential ("API key", "access token").
func Refuse(w http.ResponseWriter, client netip.Prefix, what string, wait time.Duration, failed int) {
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	msg := fmt.Sprintf("too many failed authentications from %s (%d in a row): %s checks from this address are refused for %d s; retry after that with a valid %s",
		client, failed, what, secs, what)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusTooManyRequests, "message": msg})
}
