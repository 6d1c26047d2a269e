package outside

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestOriginTLS: with --domain and the operator's wildcard certificate
// (--tls-cert, self-signed here), a sandbox port is served at
// https://<port>-<id>.<domain>/ and is a secure context in Chromium; the
// dashboard and the path form send browsers there. A server of its own:
// the suite's shared one has no domain.
func TestOriginTLS(t *testing.T) {
	const domain = "sbx.test"
	dir := t.TempDir()
	certFile, keyFile, spki := selfSignedWildcard(t, dir, domain)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := l.Addr().String()
	l.Close()
	s := harness.Start(t, harness.Name("origin-tls"), harness.Args("--domain", domain, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-listen", tlsAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, tlsPort, _ := strings.Cut(tlsAddr, ":")

	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	sb, err := client.Create(ctx, agentbox.CreateOptions{Template: "base", Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Kill(context.Background()) })
	if _, err := sb.Files.Write(ctx, "/tmp/www/index.html", []byte("<title>secure-page</title>")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Commands.Run(ctx, "cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &"); err != nil {
		t.Fatal(err)
	}
	want := "https://8000-" + sb.ID + "." + domain + ":" + tlsPort + "/"

	// The path form and the dashboard send a browser to the https origin.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/sandboxes/"+sb.ID+"/ports/8000/", nil)
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || loc != want {
		t.Errorf("path form: %d Location %q, want 308 %q", resp.StatusCode, loc, want)
	}
	st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/dashboard/api/config", nil)
	if err != nil || st != http.StatusOK || !strings.Contains(string(b), `"portDomain":"`+domain+":"+tlsPort+`"`) || !strings.Contains(string(b), `"portScheme":"https"`) {
		t.Errorf("dashboard config: %d %s %v, want https on %s:%s", st, b, err, domain, tlsPort)
	}

	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (scripts/install-deps.sh installs Debian's): %v", err)
	}
	web := filepath.Join(s.Root, "e2e", "outside", "web")
	harness.NPMInstall(t, web)
	var got struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
		Origin string `json:"origin"`
		Secure bool   `json:"secure"`
		Error  string `json:"error"`
	}
	// The server in the sandbox may still be starting: wait for its page.
	for !strings.Contains(got.Body, "secure-page") {
		cmd := exec.CommandContext(ctx, "node", "secure.mjs")
		cmd.Dir = web
		cmd.Env = append(os.Environ(), "CHROMIUM="+chromium, "URL="+want, "RESOLVE=MAP *."+domain+" 127.0.0.1", "SPKI="+spki)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("node secure.mjs: %v\n%s", err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if j, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
				if err := json.Unmarshal([]byte(j), &got); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got.Error != "" && (strings.Contains(got.Error, "ERR_CERT") || !strings.Contains(got.Error, "ERR_")) {
			t.Fatalf("browser: %s", got.Error)
		}
		if ctx.Err() != nil {
			t.Fatalf("the sandbox's page never loaded at %s: %+v", want, got)
		}
	}
	if got.Status != http.StatusOK || !got.Secure || got.Origin+"/" != want {
		t.Errorf("%s in Chromium: status %d, origin %s, secure context %v; want 200, its own origin, secure", want, got.Status, got.Origin, got.Secure)
	}
}

// selfSignedWildcard writes a self-signed certificate for *.<domain> and
// its key, and returns their paths and the base64 SHA-256 of its public
// key (what Chromium's --ignore-certificate-errors-spki-list takes).
func selfSignedWildcard(t *testing.T, dir, domain string) (certFile, keyFile, spki string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "*." + domain}, DNSNames: []string{"*." + domain},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "wildcard.pem"), filepath.Join(dir, "wildcard-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return certFile, keyFile, base64.StdEncoding.EncodeToString(sum[:])
}
