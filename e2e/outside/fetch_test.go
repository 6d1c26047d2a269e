package outside

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// allowedRegistry is a listener on loopback the suite's server is told to
// allow (--fetch-allow), as an operator allows a local registry: the
// attacks make it redirect to addresses that stay closed.
var allowedRegistry net.Listener

// fetchAllowArgs opens allowedRegistry and returns the serve flag that
// allows it.
func fetchAllowArgs() harness.Option {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return harness.Args() // TestFetchAttacks fails on the nil listener
	}
	allowedRegistry = ln
	img, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return harness.Args("--fetch-allow", ln.Addr().String()) // TestImageUnpackAttacks fails on the nil listener
	}
	imageRegistry = img
	return harness.Args("--fetch-allow", ln.Addr().String(), "--fetch-allow", img.Addr().String())
}

const fetchSecret = "SECRET-internal-service-reply-7f3a"

// internalService is a service the server's host can reach that a tenant
// must not: it answers every request with a secret and counts the
// connections and requests it gets (a kept-alive connection carries
// requests without a new connection).
type internalService struct {
	addr  string // host:port
	conns atomic.Int32
	reqs  atomic.Int32
}

func (s *internalService) reached() int32 { return s.conns.Load() + s.reqs.Load() }

func startInternalService(t *testing.T, addr string) *internalService {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &internalService{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reqs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, fetchSecret)
	}), ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

// hostExternalAddr is the host's address on its default route (no packet
// is sent to find it), or else any non-loopback IPv4 address it has.
func hostExternalAddr(t *testing.T) netip.Addr {
	t.Helper()
	if c, err := net.Dial("udp4", "8.8.8.8:53"); err == nil {
		a := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
		if a.IsValid() && !a.IsLoopback() {
			return a
		}
	}
	as, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		p, err := netip.ParsePrefix(a.String())
		if err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			return p.Addr()
		}
	}
	t.Fatal("the host has no non-loopback IPv4 address")
	return netip.Addr{}
}

// buildFromImage runs a build of team B from image ref and returns its
// failure message ("" when it got ready) and every answer the API gave
// about it (status and logs), for the secret search.
func buildFromImage(ctx context.Context, t *testing.T, s *target, ref string) (msg string, answers string, err error) {
	b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-fetch")
	if err != nil {
		return "", "", err
	}
	defer s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/templates/"+b.templateID, nil)
	path := "/templates/" + b.templateID + "/builds/" + b.buildID
	st, body, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2"+path, map[string]any{"fromImage": ref})
	if err != nil {
		return "", "", err
	}
	answers = string(body)
	if st != http.StatusAccepted {
		return fmt.Sprintf("start refused: %d %s", st, body), answers, nil
	}
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		_, body, err := s.Do(ctx, s.OtherKey, http.MethodGet, path+"/status", nil)
		if err != nil {
			return "", answers, err
		}
		var status struct {
			Status string
			Reason *struct{ Message string }
		}
		if err := json.Unmarshal(body, &status); err != nil {
			return "", answers, fmt.Errorf("status: %v: %s", err, body)
		}
		if status.Status != "ready" && status.Status != "error" {
			continue
		}
		answers += "\n" + string(body)
		_, logs, err := s.Do(ctx, s.OtherKey, http.MethodGet, path+"/logs", nil)
		if err != nil {
			return "", answers, err
		}
		answers += "\n" + string(logs)
		if status.Status == "ready" {
			return "", answers, nil
		}
		if status.Reason == nil {
			return "error", answers, nil
		}
		return status.Reason.Message, answers, nil
	}
	return "", answers, fmt.Errorf("build %s did not end", b.buildID)
}

// TestFetchAttacks: the author of a build names, as its fromImage
// registry, services only the server's host can reach. The server must
// refuse to connect, say why, and never show what such a service answers.
func TestFetchAttacks(t *testing.T) {
	s := server(t)
	if allowedRegistry == nil {
		t.Fatal("no listener for the allowed registry")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	loopback := startInternalService(t, "127.0.0.1:0")
	_, loopPort, _ := net.SplitHostPort(loopback.addr)

	// The allowed registry sends every request on to the loopback service.
	redirects := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+loopback.addr+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})}
	go redirects.Serve(allowedRegistry)
	t.Cleanup(func() { redirects.Close() })

	// check runs a build from ref and judges it: crossed when svc got a
	// connection or the secret shows in any answer; blocked when the
	// failure says the policy refused (want); an error otherwise.
	check := func(t *testing.T, ref string, svc *internalService, want ...string) error {
		before := int32(0)
		if svc != nil {
			before = svc.reached()
		}
		msg, answers, err := buildFromImage(ctx, t, s, ref)
		if err != nil {
			return err
		}
		if strings.Contains(answers, fetchSecret) || strings.Contains(msg, fetchSecret) {
			return crossed("the service's reply is in the API's answers: %.200s", msg)
		}
		if svc != nil && svc.reached() > before {
			return crossed("the server connected to %s (build: %.160s)", svc.addr, msg)
		}
		if msg == "" {
			return crossed("the build succeeded")
		}
		for _, w := range append(want, "server-side fetches may not reach", "--fetch-allow") {
			if !strings.Contains(msg, w) {
				// No refusal: the server tried to reach it.
				return crossed("the server tried to fetch (no refusal naming %q): %.200s", w, msg)
			}
		}
		t.Logf("refused: %s", msg)
		return nil
	}
	ext := hostExternalAddr(t)
	external := startInternalService(t, net.JoinHostPort(ext.String(), "0"))
	_, extPort, _ := net.SplitHostPort(external.addr)

	runAttacks(t, []attack{
		{sideBuild, "fromImage at a loopback service", func(t *testing.T) error {
			return check(t, "127.0.0.1:"+loopPort+"/probe/app:v1", loopback, "fromImage registry 127.0.0.1:"+loopPort+" is a loopback address")
		}},
		{sideBuild, "fromImage at localhost by name", func(t *testing.T) error {
			return check(t, "localhost:"+loopPort+"/probe/app:v1", loopback, "resolves to a loopback address")
		}},
		{sideBuild, "fromImage at loopback in decimal form", func(t *testing.T) error {
			return check(t, "2130706433:"+loopPort+"/probe/app:v1", loopback, "write it as a.b.c.d")
		}},
		{sideBuild, "fromImage at the host's external address", func(t *testing.T) error {
			return check(t, ext.String()+":"+extPort+"/probe/app:v1", external)
		}},
		{sideBuild, "fromImage at the metadata address 169.254.169.254", func(t *testing.T) error {
			return check(t, "169.254.169.254/latest/meta-data:v1", nil, "link-local")
		}},
		{sideBuild, "allowed registry redirects to loopback", func(t *testing.T) error {
			return check(t, allowedRegistry.Addr().String()+"/probe/app:v1", loopback, "sent the pull elsewhere", "127.0.0.1:"+loopPort+" is a loopback address")
		}},
	})
}

// gzipBomb is a gzipped tar of one file of n zero bytes: about a
// thousandth of n as sent.
func gzipBomb(t *testing.T, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: n}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestUnpackAttacks: the author of a build uploads a context that unpacks
// to far more than it weighs; the server stops at the ratio limit.
func TestUnpackAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runAttacks(t, []attack{
		{sideBuild, "context archive that is a gzip bomb", func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-bomb")
			if err != nil {
				return err
			}
			defer s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/templates/"+b.templateID, nil)
			body := gzipBomb(t, 256<<20)
			sum := sha256.Sum256(body)
			hash := hex.EncodeToString(sum[:])
			if st, rb, err := b.upload(hash, body, true); err != nil || st != http.StatusOK {
				return fmt.Errorf("upload: %d %s %v", st, rb, err)
			}
			res, err := b.run("base", []map[string]any{{"type": "COPY", "args": []string{"zeros", "/opt/"}, "filesHash": hash}})
			if err != nil {
				return err
			}
			if res == "ready" {
				return crossed("a %d-byte context unpacked to 256 MiB", len(body))
			}
			if !strings.Contains(res, "decompression ratio 100:1") {
				return crossed("refused for another reason than the ratio limit: %.200s", res)
			}
			t.Logf("refused: %s", res)
			return nil
		}},
	})
}
