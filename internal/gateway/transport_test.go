package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

type connKey struct{}

// A sandbox that boots again keeps its address, but its old network stack
// is gone without closing its connections (gVisor): a request on a
// kept-alive connection of the old boot is reset. The first request after
// a new boot must go over a new connection and succeed.
func TestNewBootNeverReusesOldConnections(t *testing.T) {
	var boot atomic.Int64 // the upstream's current boot
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		born := r.Context().Value(connKey{}).(*int64)
		if *born != boot.Load() {
			// This connection belongs to a boot that no longer exists.
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
			return
		}
		io.WriteString(w, "boot "+strconv.FormatInt(boot.Load(), 10))
	}))
	upstream.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		b := boot.Load()
		return context.WithValue(ctx, connKey{}, &b)
	}
	upstream.Start()
	defer upstream.Close()
	addr := netip.MustParseAddrPort(strings.TrimPrefix(upstream.URL, "http://"))
	sb := &sandbox.Sandbox{ID: "iabc", IP: addr.Addr(), State: sandbox.StateRunning, BootID: "first"}
	h := New(fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": sb}}, slog.New(slog.DiscardHandler)).Handler(http.NotFoundHandler())
	post := func() (int, string) {
		r := httptest.NewRequest(http.MethodPost, "/process.Process/Start", strings.NewReader("{}"))
		r.Header.Set("E2b-Sandbox-Id", "iabc")
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(int(addr.Port())))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	if code, body := post(); code != http.StatusOK || body != "boot 0" {
		t.Fatalf("first boot: %d %s", code, body)
	}
	boot.Store(1)
	sb.BootID = "second"
	if code, body := post(); code != http.StatusOK || body != "boot 1" {
		t.Fatalf("first request after a new boot: %d %s, want 200 from the new boot (an old connection was reused)", code, body)
	}
}
