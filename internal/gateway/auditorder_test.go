package gateway

import (
	"bufio"
	"context"
	"database/sql"
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

// TestStartEventsReachTheClientBeforeTheirAuditRecords: the start and end
// of a command are forwarded to the client before the gateway writes their
// audit records, so a command's round trip never waits on the database;
// the records still follow, in order. The database is held locked by
// another connection while the start passes: the start must arrive, and
// its record must be written once the lock is gone (written first, it
// would have waited out the lock and failed, and the start with it).
func TestStartEventsReachTheClientBeforeTheirAuditRecords(t *testing.T) {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.3", strconv.Itoa(sandbox.EnvdPort)))
	if err != nil {
		t.Fatalf("an envd stand-in on 127.0.0.3: %v", err)
	}
	startMsg := `{"event":{"start":{"pid":7}}}`
	endMsg := `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}`
	sendEnd := make(chan struct{})
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(http.StatusOK)
		w.Write(connectEnvelope(0, startMsg))
		w.(http.Flusher).Flush()
		<-sendEnd
		w.Write(connectEnvelope(0, endMsg))
		w.Write(connectEnvelope(2, `{}`))
	}))
	upstream.Listener.Close()
	upstream.Listener = ln
	upstream.Start()
	defer upstream.Close()
	addr := netip.MustParseAddrPort(ln.Addr().String())
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": {ID: "iabc", IP: addr.Addr(), State: sandbox.StateRunning}}}
	g := New(res, slog.New(slog.DiscardHandler))
	dbPath := filepath.Join(t.TempDir(), "db")
	st, err := store.Open(t.Context(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al := audit.New(st)
	g.SetAudit(al)
	srv := httptest.NewServer(g.Handler(http.NotFoundHandler()))
	defer srv.Close()

	// Another writer holds the database.
	other, err := sql.Open("sqlite", "file:"+dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	locked := true
	unlock := func() {
		if locked {
			locked = false
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()

	body := string(connectEnvelope(0, `{"process":{"cmd":"/bin/bash","args":["-l","-c","exit 3"]}}`))
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/process.Process/Start", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", "iabc")
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(int(addr.Port())))
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first := make([]byte, len(connectEnvelope(0, startMsg)))
	if _, err := io.ReadFull(br, first); err != nil || !strings.Contains(string(first), startMsg) {
		t.Fatalf("start event %q, %v", first, err)
	}
	unlock() // the start arrived while its record could not be written
	close(sendEnd)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), endMsg) {
		t.Fatalf("end event: %q, %v", rest, err)
	}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		evs, err := al.Query(t.Context(), audit.Query{SandboxID: "iabc", Kinds: []string{audit.KindProcess}})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range evs {
			got = append(got, e.Action+"/"+e.Decision)
		}
		if len(got) >= 2 {
			break
		}
	}
	if strings.Join(got, " ") != "start/allowed exit/info" {
		t.Fatalf("audit records %v, want the start then the exit", got)
	}
}
