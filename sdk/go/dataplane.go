package agentbox

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/api/gen/rest"
)

// dataPlane reaches one sandbox's envd through the gateway.
type dataPlane struct {
	baseURL string
	http    *http.Client // adds the routing and token headers
	process processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
}

// sandboxTransport stamps every data-plane request with the sandbox's
// routing headers and access token.
type sandboxTransport struct {
	base  http.RoundTripper
	id    string
	port  int
	token string
}

func (t *sandboxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("E2b-Sandbox-Id", t.id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
	if t.token != "" {
		req.Header.Set("X-Access-Token", t.token)
	}
	return t.base.RoundTrip(req)
}

func (c *Client) newSandbox(w rest.Sandbox) *Sandbox {
	s := &Sandbox{
		ID:              w.SandboxID,
		TemplateID:      w.TemplateID,
		Alias:           w.Alias,
		EnvdVersion:     w.EnvdVersion,
		EnvdAccessToken: w.EnvdAccessToken,
		client:          c,
	}
	if w.TrafficAccessToken != nil {
		s.TrafficAccessToken = *w.TrafficAccessToken
	}
	base := c.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := &http.Client{
		Transport:     &sandboxTransport{base: base, id: s.ID, port: EnvdPort, token: s.EnvdAccessToken},
		CheckRedirect: c.http.CheckRedirect,
		Jar:           c.http.Jar,
	}
	// JSON like the official SDKs, so the server sees one wire dialect.
	rpcOpts := []connect.ClientOption{connect.WithProtoJSON()}
	if c.msgMax > 0 {
		rpcOpts = append(rpcOpts, connect.WithReadMaxBytes(c.msgMax))
	}
	s.dp = &dataPlane{
		baseURL: c.sandboxURL,
		http:    hc,
		process: processconnect.NewProcessClient(hc, c.sandboxURL, rpcOpts...),
		fs:      filesystemconnect.NewFilesystemClient(hc, c.sandboxURL, rpcOpts...),
	}
	s.Commands = &Commands{dp: s.dp}
	s.PTY = &PTY{dp: s.dp}
	s.Files = &Files{dp: s.dp}
	return s
}

// IsRunning reports whether the sandbox's envd answers. A paused or killed
// sandbox is not running.
func (s *Sandbox) IsRunning(ctx context.Context) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.dp.baseURL+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := s.dp.http.Do(req)
	if err != nil {
		return false, fmt.Errorf("sandbox %s health: %w", s.ID, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusBadGateway:
		return false, nil
	case resp.StatusCode < 300:
		return true, nil
	}
	return false, decodeAPIError(resp)
}

// basicUser is the Authorization value that selects the OS user envd runs a
// call as.
func basicUser(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// setUser adds the user selection to a Connect request; "" keeps envd's
// default user of the template.
func setUser(h http.Header, user string) {
	if user != "" {
		h.Set("Authorization", basicUser(user))
	}
}
