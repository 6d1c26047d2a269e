package gateway

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// TestTunnel opens tunnels the way `agentbox port-forward` does: to a user
// port the bytes flow both ways and the tunnel is audited when opened and
// closed; to envd's port it is refused (and audited as refused), so a raw
// stream can never reach /init or envd's other internal routes.
func TestTunnel(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	echo, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := echo.Addr().(*net.TCPAddr).Port
	sb := &sandbox.Sandbox{ID: "itun", TeamID: "team-a", IP: netip.MustParseAddr("127.0.0.1")}
	g := New(fakeResolver{sbs: map[string]*sandbox.Sandbox{sb.ID: sb}}, slog.New(slog.DiscardHandler))
	al := audit.New(st)
	g.SetAudit(al)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := strconv.Atoi(r.PathValue("port"))
		if p == 0 {
			p, _ = strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		}
		g.Tunnel(w, r, sb, p, "key-1")
	}))
	defer hs.Close()
	open := func(p int) (net.Conn, *http.Response) {
		c, err := net.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /"+strconv.Itoa(p)+" HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: agentbox-tcp\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return &bufConn{Conn: c, r: br}, resp
	}

	c, resp := open(port)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel to an open port: %d", resp.StatusCode)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the tunnel: %q %v", buf, err)
	}
	c.(*bufConn).Conn.(*net.TCPConn).CloseWrite()
	io.ReadAll(c)
	c.Close()

	c, resp = open(sandbox.EnvdPort)
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "envd") {
		t.Fatalf("tunnel to envd's port: %d %s, want 403 naming envd", resp.StatusCode, body)
	}

	var got []string
	for range 50 {
		evs, err := al.Query(ctx, audit.Query{SandboxID: sb.ID, Kinds: []string{audit.KindIngress}})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range evs {
			got = append(got, e.Action+"/"+e.Decision+"/"+e.APIKeyID)
		}
		if len(got) == 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The close may be recorded after the refusal.
	slices.Sort(got)
	want := []string{"tunnel-closed/info/key-1", "tunnel/allowed/key-1", "tunnel/denied/key-1"}
	if !slices.Equal(got, want) {
		t.Errorf("audit events %v, want %v", got, want)
	}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
