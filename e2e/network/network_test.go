// Package network tests sandbox egress and ingress end to end: the real
// server, real sandboxes, the official e2b SDK (network.test.mjs), and a
// fake internet in its own network namespace.
package network

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/testutil"
)

// server is the harness's server with a Host-routing TLS listener.
type server struct {
	*harness.Server
	tlsAddr, tlsCA string // the TLS listener and the CA of its certificate
}

// startServer starts a server whose egress resolves and trusts the fake
// internet, and which routes <port>-<id>.sbx.test over TLS.
func startServer(t *testing.T, fake *testutil.FakeNet) *server {
	t.Helper()
	dir := t.TempDir()
	tlsCert, tlsKey, tlsCA := wildcardCert(t, dir, "sbx.test")
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := tl.Addr().String()
	tl.Close()
	caFile := filepath.Join(dir, "fake-ca.pem")
	if err := os.WriteFile(caFile, fake.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	s := harness.Start(t, harness.Args(
		"--egress-dns", fake.DNS.String(), "--egress-ca-file", caFile,
		"--domain", "sbx.test", "--log-level", "debug",
		"--tls-cert", tlsCert, "--tls-key", tlsKey, "--tls-listen", tlsAddr))
	return &server{Server: s, tlsAddr: tlsAddr, tlsCA: tlsCA}
}

// sink counts UDP datagrams by payload on the fake internet.
type sink struct {
	mu  sync.Mutex
	got map[string]string // payload → source address
}

func TestNetworkE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	harness.RequireRoot(t)
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	repo := harness.RepoRoot(t)
	fake := testutil.NewFakeNet(t, "e2n", netip.MustParsePrefix("198.18.3.0/24"), 3, map[string]netip.Addr{
		"allowed.test":     netip.MustParseAddr("198.18.3.10"),
		"api.allowed.test": netip.MustParseAddr("198.18.3.11"),
		"sub.wild.test":    netip.MustParseAddr("198.18.3.11"),
		"other.test":       netip.MustParseAddr("198.18.3.12"),
	})
	pc := fake.Listen(t, "udp4", "198.18.3.10:9").(net.PacketConn)
	defer pc.Close()
	sk := &sink{got: map[string]string{}}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			sk.mu.Lock()
			sk.got[string(buf[:n])] = from.String()
			sk.mu.Unlock()
		}
	}()
	harness.NPMInstall(t, filepath.Join(repo, "e2e", "js")) // network.test.mjs imports its e2b
	harness.SDKMatrix(t, filepath.Join(repo, "e2e", "js"), "e2b")
	s := startServer(t, fake)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(repo, "e2e/network/network.test.mjs"))
	cmd.Dir = filepath.Join(repo, "e2e/network")
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+s.URL, "E2B_SANDBOX_URL="+s.URL, "E2B_API_KEY="+s.APIKey,
		"E2E_FAKE_A=198.18.3.10", "E2E_FAKE_B=198.18.3.11", "E2E_FAKE_C=198.18.3.12",
		"E2E_SINK=198.18.3.10:9", "E2E_DOMAIN=sbx.test", "E2E_AGENTBOX="+s.Bin,
		"E2E_TLS="+s.tlsAddr, "E2E_TLS_CA="+s.tlsCA,
	)
	out, err := cmd.CombinedOutput()
	t.Logf("network.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("node: %v", err)
	}

	// The sandbox sent one datagram from its own address and then one with
	// a forged source: only the first may reach the internet. Wait for the
	// first (UDP on a loaded host may lag), not for a fixed time.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		sk.mu.Lock()
		_, ok := sk.got["legit"]
		sk.mu.Unlock()
		if ok {
			break
		}
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if _, ok := sk.got["legit"]; !ok {
		t.Errorf("the control datagram from the sandbox's own address never arrived (got %v)", sk.got)
	}
	if from, ok := sk.got["spoofed"]; ok {
		t.Errorf("a datagram with a spoofed source address reached the internet (from %s)", from)
	}
	fmt.Fprintln(os.Stderr, "sink:", sk.got)
}

// wildcardCert writes a certificate for *.<domain>, the kind an operator
// gives --tls-cert, issued by a CA of its own, and returns the paths of the
// certificate, its key and the CA (which the client trusts, like a real
// one would a public CA).
func wildcardCert(t *testing.T, dir, domain string) (certFile, keyFile, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentbox e2e ingress CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + domain},
		DNSNames:  []string{"*." + domain},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile = filepath.Join(dir, "wildcard.pem"), filepath.Join(dir, "wildcard-key.pem"), filepath.Join(dir, "ingress-ca.pem")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{certFile, "CERTIFICATE", der}, {keyFile, "PRIVATE KEY", keyDER}, {caFile, "CERTIFICATE", caDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}
