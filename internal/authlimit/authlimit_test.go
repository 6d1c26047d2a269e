package authlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// guard runs one credential check of a request from addr through l.Guard:
// valid says whether the credential is right. It returns the status
// answered (200 when served).
func guard(l *Limiter, addr string, valid bool) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr + ":999"
	w := httptest.NewRecorder()
	check := func() error {
		if valid {
			return nil
		}
		return fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	deny := func(w http.ResponseWriter, err error) { w.WriteHeader(http.StatusUnauthorized) }
	if l.Guard(w, r, "API key", check, deny) {
		w.WriteHeader(http.StatusOK)
	}
	return w
}

// TestGuard: only failures are counted and only failures are refused. A
// guesser past the burst gets 429 for wrong credentials, at the rate
// Retry-After states, while a valid credential from the same address (a
// team sharing it: MCP over loopback, a NAT) is always served, and other
// addresses are untouched.
func TestGuard(t *testing.T) {
	const guesser, shared, other = "198.51.100.7", "198.51.100.7", "198.51.100.8"
	type step struct {
		after time.Duration // clock moves this much first
		from  string
		valid bool
		want  int
	}
	burst := []step{}
	for range 5 {
		burst = append(burst, step{from: guesser, want: http.StatusUnauthorized})
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"valid keys are never counted", func() []step {
			var s []step
			for range 50 {
				s = append(s, step{from: shared, valid: true, want: http.StatusOK})
			}
			return append(s, step{from: guesser, want: http.StatusUnauthorized})
		}()},
		{"failures past the burst get 429", append(burst[:5:5],
			step{from: guesser, want: http.StatusTooManyRequests},
			step{from: guesser, want: http.StatusTooManyRequests})},
		{"a valid key from the throttled address is served", append(burst[:5:5],
			step{from: guesser, want: http.StatusTooManyRequests},
			step{from: shared, valid: true, want: http.StatusOK},
			step{from: shared, valid: true, want: http.StatusOK},
			step{from: guesser, want: http.StatusTooManyRequests})},
		{"another address is untouched", append(burst[:5:5],
			step{from: other, want: http.StatusUnauthorized},
			step{from: other, valid: true, want: http.StatusOK})},
		{"one failure per refill", append(burst[:5:5],
			step{after: 1500 * time.Millisecond, from: guesser, want: http.StatusTooManyRequests},
			step{after: 500 * time.Millisecond, from: guesser, want: http.StatusUnauthorized},
			step{from: guesser, want: http.StatusTooManyRequests})},
		{"a full refill forgets", append(burst[:5:5],
			step{after: time.Minute, from: guesser, want: http.StatusUnauthorized})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			l := New(Options{Burst: 5, Refill: 2 * time.Second, Now: c.now})
			for i, s := range tc.steps {
				c.t = c.t.Add(s.after)
				w := guard(l, s.from, s.valid)
				if w.Code != s.want {
					t.Fatalf("step %d (%s, valid %v): %d, want %d %s", i, s.from, s.valid, w.Code, s.want, w.Body)
				}
				if w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
					t.Fatalf("step %d: 429 without Retry-After", i)
				}
			}
		})
	}
}

// TestGuardUncountedErrors: an error that is not a wrong credential (the
// store is down) is answered as it is and never counted.
func TestGuardUncountedErrors(t *testing.T) {
	l := New(Options{Burst: 1})
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "198.51.100.9:1"
	for range 10 {
		w := httptest.NewRecorder()
		l.Guard(w, r, "API key", func() error { return errors.New("database is locked") },
			func(w http.ResponseWriter, err error) { w.WriteHeader(http.StatusInternalServerError) })
		if w.Code != http.StatusInternalServerError {
			t.Fatalf("%d, want the store's 500", w.Code)
		}
	}
	if l.Throttled(l.Client(r)) {
		t.Fatal("errors that are not wrong credentials were counted")
	}
}

func TestMemoryIsBounded(t *testing.T) {
	l := New(Options{Burst: 1, MaxClients: 100})
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		l.spend(netip.PrefixFrom(a, 32))
		l.spend(netip.PrefixFrom(a, 32))
	}
	if n := l.Tracked(); n != 100 {
		t.Fatalf("tracking %d addresses, want at most 100", n)
	}
	// The most recent guesser is still held.
	if !l.Throttled(netip.MustParsePrefix("10.0.39.15/32")) {
		t.Fatal("the latest guesser was evicted")
	}
}

func TestClient(t *testing.T) {
	l := New(Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for _, tc := range []struct {
		remote, xff, want string
	}{
		{"203.0.113.5:1234", "", "203.0.113.5/32"},
		// An untrusted peer cannot choose its address with the header.
		{"203.0.113.5:1234", "198.51.100.1", "203.0.113.5/32"},
		{"10.1.2.3:80", "198.51.100.1", "198.51.100.1/32"},
		// The rightmost entry not added by a trusted proxy; the client's
		// own (leftmost) claims are ignored.
		{"10.1.2.3:80", "1.2.3.4, 198.51.100.1, 10.9.9.9", "198.51.100.1/32"},
		{"10.1.2.3:80", "garbage", "10.1.2.3/32"},
		{"[2001:db8:1:2:3:4:5:6]:443", "", "2001:db8:1:2::/64"},
		{"[::ffff:203.0.113.9]:1", "", "203.0.113.9/32"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := l.Client(r).String(); got != tc.want {
			t.Errorf("Client(%s, XFF %q) = %s, want %s", tc.remote, tc.xff, got, tc.want)
		}
	}
}

func TestRefuse(t *testing.T) {
	w := httptest.NewRecorder()
	refuse(w, netip.MustParsePrefix("198.51.100.7/32"), "API key", 1200*time.Millisecond, 21)
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "2" || body.Code != 429 ||
		!strings.Contains(body.Message, "too many failed authentications") || !strings.Contains(body.Message, "198.51.100.7") {
		t.Fatalf("%d Retry-After %q body %+v", w.Code, w.Header().Get("Retry-After"), body)
	}
}
