package outside

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// sideOutsider is anyone who can reach the server's address without a
// key of their own: they guess credentials.
const sideOutsider = "outsider"

// from returns an HTTP client whose connections leave from the loopback
// address ip, so this file's failed credential checks count against an
// address of their own and never throttle the other tests (127.0.0.1).
func from(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, Proxy: nil}, Timeout: 30 * time.Second}
}

// TestEdgeAttacks: the in-sandbox ports of agentbox (the code interpreter,
// envd through a tunnel) and the guessing of credentials, from outside.
func TestEdgeAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create: %d %s %v", st, b, err)
	}
	id := jsonField(t, b, "sandboxID")
	token := jsonField(t, b, "envdAccessToken")
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	sb, err := client.Connect(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The interpreter's routes answer without kernels; base has none.
	if _, err := sb.Commands.Run(ctx, "nohup /.agentbox/bin/envd interpreter --state-dir /tmp/interp >/tmp/interp.log 2>&1 &", agentbox.WithUser("root")); err != nil {
		t.Fatal(err)
	}
	interp := func(c *http.Client, method, path, tok string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(`{"code":"1","language":"python"}`))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("X-Access-Token", tok)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.StatusCode, string(body), nil
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if st, _, _ := interp(http.DefaultClient, http.MethodGet, "/health", ""); st == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			out, _ := sb.Commands.Run(ctx, "cat /tmp/interp.log", agentbox.WithUser("root"))
			t.Fatalf("the interpreter did not come up: %v", out)
		}
	}

	guesser := from("127.0.0.2")
	var attacks []attack
	for _, r := range []struct{ method, path string }{
		{http.MethodPost, "/execute"}, {http.MethodPost, "/contexts"}, {http.MethodGet, "/contexts"},
		{http.MethodPost, "/contexts/python/restart"}, {http.MethodDelete, "/contexts/python"},
	} {
		for _, tok := range []string{"", "wrong-token"} {
			if tok == "" && r.path != "/execute" {
				// E2B's context routes take no token (its SDKs send none):
				// like every port of a sandbox, they are as public as the
				// sandbox's traffic (allowPublicTraffic=false asks a traffic
				// token at the gateway). Code runs only with the token.
				continue
			}
			name := "interpreter " + r.method + " " + r.path + " without the sandbox's token"
			if tok != "" {
				name = "interpreter " + r.method + " " + r.path + " with a wrong token"
			}
			attacks = append(attacks, attack{side: sideOutsider, name: name, run: func(t *testing.T) error {
				st, body, err := interp(guesser, r.method, r.path, tok)
				if err != nil {
					return err
				}
				if st != http.StatusUnauthorized {
					return crossed("answered %d %.100s", st, body)
				}
				return nil
			}})
		}
	}
	attacks = append(attacks,
		attack{side: sideTenant, name: "port-forward tunnel to envd's port 49983", run: func(t *testing.T) error {
			st, line, err := tunnel(ctx, s.Addr, s.APIKey, id, 49983)
			if err != nil {
				return err
			}
			if st != http.StatusForbidden {
				return crossed("tunnel answered %s", line)
			}
			// The tunnel itself works for other ports (the interpreter's).
			if st, line, err := tunnel(ctx, s.Addr, s.APIKey, id, 49999); err != nil || st != http.StatusSwitchingProtocols {
				return fmt.Errorf("tunnel to 49999: %s %v", line, err)
			}
			return nil
		}},
		attack{side: sideOutsider, name: "guess API keys from one address", run: func(t *testing.T) error {
			return guess(ctx, from("127.0.0.3"), s, func(c *http.Client, i int) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v2/sandboxes", nil)
				req.Header.Set("X-API-Key", fmt.Sprintf("e2b_%040x", i))
				return c.Do(req)
			})
		}},
		attack{side: sideOutsider, name: "guess a sandbox's envd access token", run: func(t *testing.T) error {
			return guess(ctx, from("127.0.0.4"), s, func(c *http.Client, i int) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/envs", nil)
				req.Header.Set("E2b-Sandbox-Id", id)
				req.Header.Set("E2b-Sandbox-Port", "49983")
				req.Header.Set("X-Access-Token", fmt.Sprintf("%040x", i))
				return c.Do(req)
			})
		}},
	)
	runAttacks(t, attacks)
	// The owner, at another address, still gets in with the token.
	if st, body, err := interp(http.DefaultClient, http.MethodGet, "/contexts", token); err != nil || st != http.StatusOK {
		t.Errorf("the owner's token on GET /contexts: %d %s %v", st, body, err)
	}
}

// guess sends up to 40 wrong credentials: blocked when the address is
// answered 429 with Retry-After before the end, while a valid key from
// 127.0.0.1 is still served.
func guess(ctx context.Context, c *http.Client, s *target, try func(*http.Client, int) (*http.Response, error)) error {
	for i := range 40 {
		resp, err := try(c, i)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			continue
		case http.StatusTooManyRequests:
			if resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "too many failed authentications") {
				return crossed("429 without Retry-After or a reason: %q %s", resp.Header.Get("Retry-After"), body)
			}
			if st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes", nil); err != nil || st != http.StatusOK {
				return crossed("another address's valid key was refused meanwhile: %d %.100s %v", st, b, err)
			}
			return nil
		default:
			return crossed("guess %d answered %d %.100s", i, resp.StatusCode, body)
		}
	}
	return crossed("40 wrong guesses from one address, all answered 401")
}

// tunnel opens a port-forward tunnel and returns the status of the answer.
func tunnel(ctx context.Context, addr, key, id string, port int) (int, string, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /sandboxes/%s/tunnel/%d HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\nConnection: Upgrade\r\nUpgrade: agentbox-tcp\r\n\r\n", id, port, addr, key)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, resp.Status, nil
}
