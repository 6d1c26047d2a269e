package envd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	fspb "github.com/agentbox/agentbox/api/gen/filesystem"
	procpb "github.com/agentbox/agentbox/api/gen/process"
)

// TestEveryRouteNeedsTheToken attacks every route of a secure envd without
// its token and with a wrong one. The Connect routes are taken from the
// service descriptors, so a new RPC is covered without editing this test.
// Only GET /health is open (as in E2B); /files also takes a signature.
func TestEveryRouteNeedsTheToken(t *testing.T) {
	// Every RPC is called with the token and an empty body, so the default
	// user's home must be the test's own, never the host's.
	home := t.TempDir()
	passwd := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:"+home+":/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{Logger: slog.New(slog.DiscardHandler), LocalInit: true, PasswdFile: passwd})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	defer hs.CloseClientConnections()
	call := func(method, path, ct, token string) int {
		// A stream the token let through may run on; its status is what
		// counts, and it comes with the headers.
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, hs.URL+path, strings.NewReader("{}"))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := hs.Client().Do(req)
		if errors.Is(err, context.DeadlineExceeded) {
			return 0 // no answer yet: past the middleware
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if got := call("POST", "/init", "application/json", ""); got != http.StatusNoContent {
		t.Fatalf("first /init: %d", got)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", hs.URL+"/init", strings.NewReader(`{"accessToken":"good"}`))
	if resp, err := hs.Client().Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init with token: %v %v", err, resp)
	}

	type route struct{ method, path, ct string }
	routes := []route{
		{"GET", "/envs", ""}, {"GET", "/metrics", ""}, {"GET", "/auth", ""},
		{"GET", "/files?path=/etc/hostname", ""}, {"POST", "/files?path=/tmp/x", "application/octet-stream"},
		{"POST", "/init", "application/json"}, {"GET", "/nope", ""},
	}
	for _, fd := range []protoreflect.FileDescriptor{procpb.File_process_process_proto, fspb.File_filesystem_filesystem_proto} {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				ct := "application/json"
				if m.IsStreamingClient() || m.IsStreamingServer() {
					ct = "application/connect+json"
				}
				routes = append(routes, route{"POST", "/" + string(svc.FullName()) + "/" + string(m.Name()), ct})
			}
		}
	}
	if len(routes) < 20 {
		t.Fatalf("only %d routes found; the descriptors changed", len(routes))
	}
	for _, rt := range routes {
		for _, bad := range []string{"", "bad", "goo"} {
			if got := call(rt.method, rt.path, rt.ct, bad); got != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: %d, want 401", rt.method, rt.path, bad, got)
			}
		}
		if got := call(rt.method, rt.path, rt.ct, "good"); got == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", rt.method, rt.path)
		}
	}
	if got := call("GET", "/health", "", ""); got != http.StatusNoContent {
		t.Errorf("GET /health without a token: %d, want 204", got)
	}
}

// TestInitRefusedFromInside attacks /init the way sandbox code would: from
// loopback and from the sandbox's own address. Only a peer on the other
// side of the link (the server) may configure envd.
func TestInitRefusedFromInside(t *testing.T) {
	s := NewServer(Options{Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	resp, err := hs.Client().Post(hs.URL+"/init", "application/json", strings.NewReader(`{"maxCommandSeconds":999999}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("/init from loopback: %d, want 403", resp.StatusCode)
	}
	if s.maxCommand != 0 {
		t.Errorf("the refused /init changed the cap to %s", s.maxCommand)
	}
	var own string
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				own = n.IP.String()
				break
			}
		}
	}
	for _, tc := range []struct {
		addr  string
		local bool
	}{
		{"127.0.0.1:1", true}, {"127.9.9.9:1", true}, {"[::1]:1", true}, {"0.0.0.0:1", true},
		{"garbage", true}, {"192.0.2.77:4000", false}, {"[2001:db8::7]:4000", false},
	} {
		if got := fromThisHost(tc.addr); got != tc.local {
			t.Errorf("fromThisHost(%q) = %v, want %v", tc.addr, got, tc.local)
		}
	}
	if own != "" && !fromThisHost(net.JoinHostPort(own, "1")) {
		t.Errorf("own address %s not recognised as local", own)
	}
}
