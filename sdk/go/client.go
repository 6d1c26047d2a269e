// Package agentbox is the Go client of agentbox. It speaks the E2B wire
// protocol: a REST control plane (create, list, kill sandboxes) authenticated
// with an API key, and a per-sandbox data plane (commands, terminals, files)
// served by the envd daemon inside each sandbox, reached through the
// agentbox gateway. The same client works against E2B-compatible servers.
//
//	c := agentbox.New() // AGENTBOX_API_URL / AGENTBOX_API_KEY from the environment
//	sbx, err := c.Create(ctx, agentbox.CreateOptions{Template: "base"})
//	...
//	defer sbx.Kill(ctx)
//	res, err := sbx.Commands.Run(ctx, "echo hello")
package agentbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// DefaultAPIURL is used when neither an option nor the environment names one.
const DefaultAPIURL = "http://127.0.0.1:3000"

// EnvdPort is the port of the in-sandbox daemon the data plane talks to.
const EnvdPort = 49983

// Client talks to one agentbox (or E2B-compatible) server. It is safe for
// concurrent use.
type Client struct {
	apiURL     string
	apiKey     string
	sandboxURL string
	http       *http.Client
	msgMax     int    // WithMessageLimit
	domain     string // WithDomain
}

// Option configures a Client.
type Option func(*Client)

// WithAPIURL sets the control-plane base URL. Default: $AGENTBOX_API_URL,
// then $E2B_API_URL, then http://127.0.0.1:3000.
func WithAPIURL(u string) Option { return func(c *Client) { c.apiURL = u } }

// WithAPIKey sets the key sent as X-API-Key. Default: $AGENTBOX_API_KEY,
// then $E2B_API_KEY.
func WithAPIKey(k string) Option { return func(c *Client) { c.apiKey = k } }

// WithSandboxURL sets the data-plane base URL (the gateway). Default:
// $AGENTBOX_SANDBOX_URL, then $E2B_SANDBOX_URL, then the API URL. Requests
// name their sandbox with the E2b-Sandbox-Id and E2b-Sandbox-Port headers.
func WithSandboxURL(u string) Option { return func(c *Client) { c.sandboxURL = u } }

// WithHTTPClient sets the HTTP client for both planes. It must not have a
// Timeout: command and watch streams stay open for as long as they run.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithMessageLimit refuses data-plane RPC messages (a chunk of process
// output, a directory listing) bigger than n bytes, so the code in a
// sandbox cannot make the client hold an arbitrarily big one. Zero
// (default): no limit.
func WithMessageLimit(n int) Option { return func(c *Client) { c.msgMax = n } }

// WithDomain sets the domain of sandbox port hosts <port>-<id>.<domain>
// (the server's --domain, with a ":port" if the hosts are reached on one)
// for Sandbox.PortURL. Default: $AGENTBOX_DOMAIN, then $E2B_DOMAIN, then
// localhost with the data plane's port.
func WithDomain(d string) Option { return func(c *Client) { c.domain = d } }

// New returns a client configured from opts and the environment.
func New(opts ...Option) *Client {
	c := &Client{
		apiURL:     firstEnv("AGENTBOX_API_URL", "E2B_API_URL"),
		apiKey:     firstEnv("AGENTBOX_API_KEY", "E2B_API_KEY"),
		sandboxURL: firstEnv("AGENTBOX_SANDBOX_URL", "E2B_SANDBOX_URL"),
		domain:     firstEnv("AGENTBOX_DOMAIN", "E2B_DOMAIN"),
		http:       &http.Client{},
	}
	for _, o := range opts {
		o(c)
	}
	if c.apiURL == "" {
		c.apiURL = DefaultAPIURL
	}
	c.apiURL = strings.TrimRight(c.apiURL, "/")
	if c.sandboxURL == "" {
		c.sandboxURL = c.apiURL
	}
	c.sandboxURL = strings.TrimRight(c.sandboxURL, "/")
	if c.http == nil {
		c.http = &http.Client{}
	}
	return c
}

// APIURL is the control-plane base URL in use.
func (c *Client) APIURL() string { return c.apiURL }

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// do sends a control-plane request with a JSON body (nil for none) and
// decodes a JSON answer into out (nil to ignore it). Any status outside
// wantStatus becomes an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body, out any, wantStatus ...int) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.apiURL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		req.Header.Set("X-API-Key", c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	ok := false
	for _, s := range wantStatus {
		ok = ok || resp.StatusCode == s
	}
	if !ok {
		return resp, decodeAPIError(resp)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("%s %s: decode response: %w", method, path, err)
		}
	}
	return resp, nil
}
