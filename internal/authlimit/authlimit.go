// Package authlimit slows down credential guessing: it counts the failed
// authentications of each client address (API keys, volume tokens, sandbox
// access and traffic tokens, signed file URLs) and, past a burst, answers
// that address's wrong credentials with 429 and Retry-After until its
// allowance refills. Only failures are counted and only failures are
// refused: a valid credential is always served, from any address (Guard).
// Memory is bounded: at most MaxClients addresses are tracked, least
// recently failed first out.
package authlimit

import (
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
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

// spend counts one failed authentication of client when its allowance has
// room for it. When it has none, the failure is refused: wait is how long
// until the next one would be allowed and failed how many got it there.
func (l *Limiter) spend(client netip.Prefix) (wait time.Duration, failed int, ok bool) {
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
	l.lru.MoveToFront(e)
	if b.tokens < 1 {
		return time.Duration((1 - b.tokens) * float64(l.opts.Refill)), b.failed, false
	}
	b.tokens--
	b.failed++
	return 0, b.failed, true
}

// Guard is the one place where the outcome of a credential check becomes
// an answer, on every surface that checks one (API keys, volume tokens,
// sandbox access and traffic tokens, signed URLs). check looks at the
// credential r presents (what names it, e.g. "API key"):
//
//   - nil: the credential is valid and Guard returns true. A valid
//     credential is never refused and never counted, whatever else came
//     from its address: teams sharing an address (MCP calling back over
//     loopback, a NAT'd backend) never lock each other out.
//   - an error wrapping errdefs.ErrUnauthenticated: a wrong credential. It
//     is counted against the client's address and answered by deny while
//     the address has failures left, then with 429 and Retry-After until
//     its allowance refills.
//   - any other error (the store is down) is answered by deny, uncounted.
//
// Checking before refusing makes the answer to a throttled guesser tell a
// right guess (served) from a wrong one (429). That is no oracle worth
// having: every credential the server issues is a random or keyed secret
// of 160 bits or more (API keys: 20 random bytes; access and traffic
// tokens: 160-bit HMACs of the sandbox id; volume tokens and signed URLs:
// 256-bit MACs; upload links: 24 random bytes), so no rate of guessing
// finds one. The throttle bounds the work and noise of guessing; the
// length of the secrets is what keeps them secret.
func (l *Limiter) Guard(w http.ResponseWriter, r *http.Request, what string, check func() error, deny func(http.ResponseWriter, error)) bool {
	err := check()
	if err == nil {
		return true
	}
	if errors.Is(err, errdefs.ErrUnauthenticated) {
		client := l.Client(r)
		if wait, failed, ok := l.spend(client); !ok {
			refuse(w, client, what, wait, failed)
			return false
		}
	}
	deny(w, err)
	return false
}

// Throttled reports whether client has spent its allowance of failures
// (and its next wrong credential would get 429).
func (l *Limiter) Throttled(client netip.Prefix) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, found := l.clients[client]
	if !found {
		return false
	}
	b := e.Value.(*bucket)
	l.refill(b, l.opts.Now())
	return b.tokens < 1
}

// Tracked is how many addresses the limiter holds.
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// refuse answers a wrong credential from a client whose failures are
// spent: 429 in E2B's error shape, a Retry-After in whole seconds, and a
// message saying why. what names the credential ("API key").
func refuse(w http.ResponseWriter, client netip.Prefix, what string, wait time.Duration, failed int) {
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	msg := fmt.Sprintf("too many failed authentications from %s (%d in a row): this %s is not valid, and wrong ones from this address are refused for %d s; a valid %s is always served",
		client, failed, what, secs, what)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusTooManyRequests, "message": msg})
}
