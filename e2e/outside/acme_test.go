package outside

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// pebbleDir is where scripts/install-deps.sh puts Pebble, the ACME test CA.
const pebbleDir = "/usr/local/libexec/agentbox/pebble-v2.10.3"

// TestACME: with --domain and --acme-directory (Pebble here, a real ACME
// CA validating by TLS-ALPN-01 against the server's TLS listener), a port
// host gets a certificate of its own on its first HTTPS request. Anyone can
// name any host in a handshake, so the attacks try to make the server spend
// the operator's CA quota: hosts of no sandbox, of another domain, and more
// ports of one sandbox than --acme-certs-per-sandbox.
func TestACME(t *testing.T) {
	const domain = "sbx.test"
	for _, b := range []string{"pebble", "pebble-challtestsrv"} {
		if _, err := os.Stat(filepath.Join(pebbleDir, b)); err != nil {
			t.Fatalf("%s is not installed (scripts/install-deps.sh builds it): %v", b, err)
		}
	}
	dir := t.TempDir()
	dnsAddr, dirAddr, mgmtAddr, tlsAddr := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	_, tlsPort, _ := strings.Cut(tlsAddr, ":")
	_, dnsPort, _ := strings.Cut(dnsAddr, ":")
	// The CA's resolver answers 127.0.0.1 for every name, so it validates
	// <port>-<id>.sbx.test against our TLS listener.
	chMgmt := freeAddr(t)
	startDaemon(t, chMgmt, exec.Command(filepath.Join(pebbleDir, "pebble-challtestsrv"), "-dnsserver", dnsAddr, "-defaultIPv4", "127.0.0.1",
		"-defaultIPv6", "", "-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", "", "-management", chMgmt))
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": dirAddr, "managementListenAddress": mgmtAddr,
		"certificate": filepath.Join(pebbleDir, "cert.pem"), "privateKey": filepath.Join(pebbleDir, "key.pem"),
		"httpPort": 5002, "tlsPort": atoi(t, tlsPort), "ocspResponderURL": "", "externalAccountBindingRequired": false,
	}}
	b, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	pebble := exec.Command(filepath.Join(pebbleDir, "pebble"), "-config", cfgFile, "-dnsserver", "127.0.0.1:"+dnsPort)
	pebble.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	startDaemon(t, dirAddr, pebble)
	_, dirPort, _ := strings.Cut(dirAddr, ":")
	_, mgmtPort, _ := strings.Cut(mgmtAddr, ":")
	minica := filepath.Join(pebbleDir, "pebble.minica.pem")

	s := harness.Start(t, harness.Name("acme"), harness.Args("--domain", domain, "--tls-listen", tlsAddr,
		"--acme-directory", "https://localhost:"+dirPort+"/dir", "--acme-ca-file", minica,
		"--acme-certs-per-sandbox", "2", "--acme-certs-per-hour", "10"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	sb, err := client.Create(ctx, agentbox.CreateOptions{Template: "base", Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Kill(context.Background()) })
	if _, err := sb.Files.Write(ctx, "/tmp/www/index.html", []byte("acme-page")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Commands.Run(ctx, "cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &"); err != nil {
		t.Fatal(err)
	}

	// Pebble signs with a root it makes at start: trust that, and only that.
	roots := x509.NewCertPool()
	{
		minPEM, err := os.ReadFile(minica)
		if err != nil {
			t.Fatal(err)
		}
		mgmtRoots := x509.NewCertPool()
		mgmtRoots.AppendCertsFromPEM(minPEM)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mgmtRoots}}}
		resp, err := hc.Get("https://localhost:" + mgmtPort + "/roots/0")
		if err != nil {
			t.Fatal(err)
		}
		rootPEM, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !roots.AppendCertsFromPEM(rootPEM) {
			t.Fatalf("pebble root: %s", rootPEM)
		}
	}
	// handshake connects to the TLS listener naming host, verifying the
	// certificate against Pebble's root.
	handshake := func(host string) (*tls.ConnectionState, error) {
		d := &net.Dialer{Timeout: 10 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", tlsAddr, &tls.Config{ServerName: host, RootCAs: roots})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		st := c.ConnectionState()
		return &st, nil
	}

	// The port host gets its certificate and serves the sandbox's page.
	host := "8000-" + sb.ID + "." + domain
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, tlsAddr)
		},
	}}
	var page string
	for !strings.Contains(page, "acme-page") {
		resp, err := hc.Get("https://" + host + ":" + tlsPort + "/")
		if err != nil {
			if strings.Contains(err.Error(), "certificate") {
				t.Fatalf("https://%s: %v", host, err)
			}
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			page = string(b)
		}
		if ctx.Err() != nil {
			t.Fatalf("https://%s never served the page: %v %q", host, err, page)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st, err := handshake(host); err != nil || st.PeerCertificates[0].Subject.CommonName != host && !slices.Contains(st.PeerCertificates[0].DNSNames, host) {
		t.Errorf("certificate of %s: %v", host, err)
	}

	cacheHas := func(h string) bool {
		_, err := os.Stat(filepath.Join(s.DataDir, "acme", h))
		return err == nil
	}
	refused := func(h string) error {
		if st, err := handshake(h); err == nil {
			return crossed("the server obtained a certificate for %s (issuer %s)", h, st.PeerCertificates[0].Issuer.CommonName)
		}
		if cacheHas(h) {
			return crossed("a certificate for %s is in the cache", h)
		}
		return nil
	}
	runAttacks(t, []attack{
		{side: sideOutsider, name: "ACME: a handshake naming a port host of no sandbox", run: func(t *testing.T) error {
			return refused("8000-nosuchsandbox0000000." + domain)
		}},
		{side: sideOutsider, name: "ACME: a handshake naming a host outside --domain", run: func(t *testing.T) error {
			return refused("8000-" + sb.ID + ".attacker.test")
		}},
		{side: sideOutsider, name: "ACME: more port hosts of one sandbox than --acme-certs-per-sandbox", run: func(t *testing.T) error {
			// 8000 has one; 8001 is the second and last.
			if _, err := handshake(fmt.Sprintf("8001-%s.%s", sb.ID, domain)); err != nil {
				return fmt.Errorf("the second port host got no certificate: %w", err)
			}
			for p := 8002; p < 8005; p++ {
				if err := refused(fmt.Sprintf("%d-%s.%s", p, sb.ID, domain)); err != nil {
					return err
				}
			}
			return nil
		}},
	})

	if !cacheHas(host) {
		t.Errorf("no cached certificate for %s", host)
	}
	if fi, err := os.Stat(filepath.Join(s.DataDir, "acme")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("acme cache dir: %v %v, want 0700", fi.Mode().Perm(), err)
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startDaemon runs cmd until the test ends (its output in the test log on
// failure) and waits until it accepts connections on addr.
func startDaemon(t *testing.T, addr string, cmd *exec.Cmd) {
	t.Helper()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(cmd.Path), out.String())
		}
	})
	for deadline := time.Now().Add(time.Minute); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened on %s: %v\n%s", filepath.Base(cmd.Path), addr, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
