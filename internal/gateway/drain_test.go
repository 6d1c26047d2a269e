package gateway

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

func connectEnvelope(flags byte, msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// TestConnectStreamFollow: envelopes split anywhere across writes are
// followed, and the end-of-stream flag is seen.
func TestConnectStreamFollow(t *testing.T) {
	stream := append(append(connectEnvelope(0, `{"a":1}`), connectEnvelope(0, "")...), connectEnvelope(0, `{"b":22}`)...)
	for _, tc := range []struct {
		name     string
		data     []byte
		boundary bool
		ended    bool
	}{
		{"messages", stream, true, false},
		{"mid header", stream[:3], false, false},
		{"mid message", stream[:8], false, false},
		{"ended", append(append([]byte{}, stream...), connectEnvelope(2, `{}`)...), true, true},
	} {
		for split := 1; split <= len(tc.data); split++ {
			c := &connectStream{ResponseWriter: httptest.NewRecorder(), streaming: true, wrote: true}
			for p := tc.data; len(p) > 0; {
				k := min(split, len(p))
				c.follow(p[:k])
				p = p[k:]
			}
			if at := c.left == 0 && c.nhdr == 0; at != tc.boundary || c.ended != tc.ended {
				t.Errorf("%s, writes of %d: boundary %v ended %v, want %v %v", tc.name, split, at, c.ended, tc.boundary, tc.ended)
			}
		}
	}
}

// TestDrainEndsConnectStreams: on Drain a Connect stream proxied to a
// sandbox ends with an end-of-stream message carrying "unavailable" (what a
// Connect client reports as a retryable error), not with a cut connection;
// another kind of stream is cut as before.
func TestDrainEndsConnectStreams(t *testing.T) {
	// envd's port, so the audit tap of process starts sits in the path too
	// and every message must still be flushed through it at once.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(sandbox.EnvdPort)))
	if err != nil {
		t.Fatalf("an envd stand-in on 127.0.0.2: %v", err)
	}
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusOK)
		w.Write(connectEnvelope(0, `{"event":"start"}`))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	upstream.Listener.Close()
	upstream.Listener = ln
	upstream.Start()
	defer upstream.Close()
	addr := netip.MustParseAddrPort(ln.Addr().String())
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": {ID: "iabc", IP: addr.Addr(), State: sandbox.StateRunning}}}
	g := New(res, slog.New(slog.DiscardHandler))
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g.SetAudit(audit.New(st))
	srv := httptest.NewServer(g.Handler(http.NotFoundHandler()))
	srv.Config.ErrorLog = nil
	defer srv.Close()

	open := func(ct string) (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/process.Process/Start", strings.NewReader(""))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("E2b-Sandbox-Id", "iabc")
		req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(int(addr.Port())))
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		first := make([]byte, len(connectEnvelope(0, `{"event":"start"}`)))
		if _, err := io.ReadFull(br, first); err != nil {
			t.Fatalf("%s: first message: %v (a writer in the path held it back)", ct, err)
		}
		return resp, br
	}
	connect, cbody := open("application/connect+json")
	defer connect.Body.Close()
	other, obody := open("application/octet-stream")
	defer other.Body.Close()

	g.Drain()
	rest, err := io.ReadAll(cbody)
	if err != nil {
		t.Fatalf("Connect stream after the drain: %v (read %q), want its end message", err, rest)
	}
	if len(rest) < 5 || rest[0] != 0x02 || !bytes.Contains(rest[5:], []byte(`"code":"unavailable"`)) || !bytes.Contains(rest, []byte("shutting down")) {
		t.Fatalf("Connect stream ended with %q, want an end-of-stream message with code unavailable", rest)
	}
	if _, err := io.ReadAll(obody); err == nil {
		t.Error("a non-Connect stream ended cleanly on the drain; it has no end message and must be cut")
	}
}
