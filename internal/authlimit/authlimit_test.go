package authlimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestGuessingIsThrottledPerClient guesses from one address past the burst:
// that address is refused until its allowance refills, at the rate stated
// in Retry-After, while another address is untouched.
func TestGuessingIsThrottledPerClient(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Burst: 5, Refill: 2 * time.Second, Now: c.now})
	guesser, other := netip.MustParsePrefix("198.51.100.7/32"), netip.MustParsePrefix("198.51.100.8/32")
	for i := range 5 {
		if _, _, ok := l.Check(guesser); !ok {
			t.Fatalf("refused after %d failures, burst is 5", i)
		}
		l.Fail(guesser)
	}
	wait, failed, ok := l.Check(guesser)
	if ok || failed != 5 || wait != 2*time.Second {
		t.Fatalf("after the burst: ok=%v failed=%d wait=%s, want refused, 5, 2s", ok, failed, wait)
	}
	if _, _, ok := l.Check(other); !ok {
		t.Fatal("another address is refused for the guesser's failures")
	}
	c.t = c.t.Add(1500 * time.Millisecond)
	if wait, _, ok := l.Check(guesser); ok || wait != 500*time.Millisecond {
		t.Fatalf("1.5 s later: ok=%v wait=%s, want refused for 500ms", ok, wait)
	}
	c.t = c.t.Add(500 * time.Millisecond)
	if _, _, ok := l.Check(guesser); !ok {
		t.Fatal("not allowed again once the wait is over")
	}
	l.Fail(guesser) // one more guess spends the one refilled try
	if _, _, ok := l.Check(guesser); ok {
		t.Fatal("a sustained guesser gets more than one try per refill")
	}
	// A full refill forgets the history.
	c.t = c.t.Add(time.Minute)
	if _, failed, ok := l.Check(guesser); !ok || failed != 0 {
		t.Fatalf("after a full refill: ok=%v failed=%d", ok, failed)
	}
}

func TestMemoryIsBounded(t *testing.T) {
	l := New(Options{Burst: 1, MaxClients: 100})
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		l.Fail(netip.PrefixFrom(a, 32))
	}
	if n := l.Tracked(); n != 100 {
		t.Fatalf("tracking %d addresses, want at most 100", n)
	}
	// The most recent guesser is still held.
	if _, _, ok := l.Check(netip.MustParsePrefix("10.0.39.15/32")); ok {
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
	Refuse(w, netip.MustParsePrefix("198.51.100.7/32"), "API key", 1200*time.Millisecond, 21)
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
