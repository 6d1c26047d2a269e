// Package wire is a minimal client of the E2B wire protocol (control-plane
// REST, envd Connect-JSON, /files) written straight from the protocol notes.
// Black-box tests and the bench use it so that they check the server against
// the protocol itself, independently of agentbox's own Go SDK.
package wire

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// Client talks to one agentbox (or E2B) server; API and data plane share the
// base URL.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
}

// New returns a client with an HTTP client without overall timeout (streams
// can be long; callers bound work with contexts).
func New(baseURL, apiKey string) *Client {
	return &Client{
		BaseURL: strings.TrimRight(baseURL, "/"),
		APIKey:  apiKey,
		HTTP:    &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}
}

// Error is a non-2xx answer of the server.
type Error struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Status, strings.TrimSpace(e.Body))
}

// IsStatus reports whether err is an *Error with the given HTTP status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// Sandbox is the create/connect answer.
type Sandbox struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
}

// CreateRequest is the body of POST /v2/sandboxes.
type CreateRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             int               `json:"timeout,omitempty"` // seconds
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	VolumeMounts        []VolumeMount     `json:"volumeMounts,omitempty"`
	PIDs                int               `json:"pids,omitempty"` // process limit (agentbox extension)
}

// VolumeMount mounts the team's volume Name at Path (E2B's SandboxVolumeMount).
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ListedSandbox is one entry of GET /v2/sandboxes.
type ListedSandbox struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	State      string            `json:"state"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	Metadata   map[string]string `json:"metadata"`
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.APIKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &Error{Method: method, Path: path, Status: resp.StatusCode, Body: string(data)}
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// Health is GET /health; nil when the server answers 2xx.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/health", nil, nil)
}

// Create is POST /v2/sandboxes.
func (c *Client) Create(ctx context.Context, r CreateRequest) (*Sandbox, error) {
	var s Sandbox
	if err := c.do(ctx, http.MethodPost, "/v2/sandboxes", r, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Get is GET /sandboxes/{id}.
func (c *Client) Get(ctx context.Context, id string) (*ListedSandbox, error) {
	var s ListedSandbox
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// List is GET /v2/sandboxes filtered by metadata (all pages).
func (c *Client) List(ctx context.Context, metadata map[string]string) ([]ListedSandbox, error) {
	q := url.Values{}
	if len(metadata) > 0 {
		// As the e2b SDKs send it: each key and value encoded, then the
		// pairs, then (by q.Encode) the parameter.
		m := url.Values{}
		for k, v := range metadata {
			m.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		q.Set("metadata", m.Encode())
	}
	var all []ListedSandbox
	for {
		var page []ListedSandbox
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/v2/sandboxes?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-API-Key", c.APIKey)
		resp, err := c.HTTP.Do(req)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, &Error{Method: "GET", Path: "/v2/sandboxes", Status: resp.StatusCode, Body: string(data)}
		}
		if err := json.Unmarshal(data, &page); err != nil {
			return nil, fmt.Errorf("list: decode: %w", err)
		}
		all = append(all, page...)
		next := resp.Header.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return all, nil
		}
		q.Set("nextToken", next)
	}
}

// Kill is DELETE /sandboxes/{id}.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
}

func (c *Client) envdRequest(ctx context.Context, s *Sandbox, method, pathAndQuery string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+pathAndQuery, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("E2b-Sandbox-Id", s.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	if s.EnvdAccessToken != "" {
		req.Header.Set("X-Access-Token", s.EnvdAccessToken)
	}
	return req, nil
}

// Result is the outcome of one command.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
	Status         string
}

// Run starts `/bin/bash -l -c cmd` through envd's process.Process/Start
// (Connect server stream, JSON codec) as user and waits for its end.
func (c *Client) Run(ctx context.Context, s *Sandbox, user, cmd string) (*Result, error) {
	return c.RunTagged(ctx, s, user, cmd, "")
}

// RunTagged is Run with a tag (when not empty) that Signal can name the
// command by while it runs.
func (c *Client) RunTagged(ctx context.Context, s *Sandbox, user, cmd, tag string) (*Result, error) {
	start := map[string]any{
		"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", cmd}},
		"stdin":   false,
	}
	if tag != "" {
		start["tag"] = tag
	}
	msg, err := json.Marshal(start)
	if err != nil {
		return nil, err
	}
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	req, err := c.envdRequest(ctx, s, http.MethodPost, "/process.Process/Start", &env)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	if user != "" {
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return nil, &Error{Method: "POST", Path: "/process.Process/Start", Status: resp.StatusCode, Body: string(data)}
	}
	return readProcessStream(bufio.NewReader(resp.Body))
}

// Signal sends SIGKILL (kill) or SIGTERM to the command tagged tag through
// envd's process.Process/SendSignal (Connect unary, JSON); SIGKILL ends the
// command's whole tree.
func (c *Client) Signal(ctx context.Context, s *Sandbox, tag string, kill bool) error {
	sig := "SIGNAL_SIGTERM"
	if kill {
		sig = "SIGNAL_SIGKILL"
	}
	body, err := json.Marshal(map[string]any{"process": map[string]any{"tag": tag}, "signal": sig})
	if err != nil {
		return err
	}
	req, err := c.envdRequest(ctx, s, http.MethodPost, "/process.Process/SendSignal", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return &Error{Method: "POST", Path: "/process.Process/SendSignal", Status: resp.StatusCode, Body: string(data)}
	}
	return nil
}

type processEvent struct {
	Event *struct {
		Start *struct {
			Pid uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
		} `json:"data"`
		End *struct {
			ExitCode int    `json:"exitCode"`
			Exited   bool   `json:"exited"`
			Status   string `json:"status"`
			Error    string `json:"error"`
		} `json:"end"`
	} `json:"event"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func readProcessStream(r *bufio.Reader) (*Result, error) {
	var res Result
	var stdout, stderr bytes.Buffer
	ended := false
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) && ended {
				break
			}
			return nil, fmt.Errorf("process stream: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("process stream: %w", err)
		}
		var ev processEvent
		if err := json.Unmarshal(buf, &ev); err != nil {
			return nil, fmt.Errorf("process stream: decode %q: %w", buf, err)
		}
		if hdr[0]&0x02 != 0 { // end of stream
			if ev.Error != nil {
				return nil, fmt.Errorf("process stream: %s: %s", ev.Error.Code, ev.Error.Message)
			}
			break
		}
		switch {
		case ev.Event == nil:
		case ev.Event.Data != nil:
			stdout.Write(ev.Event.Data.Stdout)
			stderr.Write(ev.Event.Data.Stderr)
		case ev.Event.End != nil:
			ended = true
			res.ExitCode = ev.Event.End.ExitCode
			res.Status = ev.Event.End.Status
		}
	}
	if !ended {
		return nil, errors.New("process stream ended without an end event")
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	return &res, nil
}

// Upload writes body to path in the sandbox (POST /files, octet-stream).
func (c *Client) Upload(ctx context.Context, s *Sandbox, path string, body io.Reader, size int64) error {
	req, err := c.envdRequest(ctx, s, http.MethodPost, "/files?path="+url.QueryEscape(path), body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return &Error{Method: "POST", Path: "/files", Status: resp.StatusCode, Body: string(data)}
	}
	return nil
}

// Download copies the file at path in the sandbox to w (GET /files) and
// returns the byte count. The transport asks for gzip and inflates it.
func (c *Client) Download(ctx context.Context, s *Sandbox, path string, w io.Writer) (int64, error) {
	return c.DownloadEncoded(ctx, s, path, w, "")
}

// DownloadEncoded is Download asking for one content coding: "identity"
// (the bytes as they are) or "gzip" (inflated here); "" leaves the choice
// to the transport.
func (c *Client) DownloadEncoded(ctx context.Context, s *Sandbox, path string, w io.Writer, coding string) (int64, error) {
	req, err := c.envdRequest(ctx, s, http.MethodGet, "/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return 0, err
	}
	if coding != "" {
		req.Header.Set("Accept-Encoding", coding)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return 0, &Error{Method: "GET", Path: "/files", Status: resp.StatusCode, Body: string(data)}
	}
	if coding == "" || coding == "identity" || resp.Uncompressed {
		return io.Copy(w, resp.Body)
	}
	if got := resp.Header.Get("Content-Encoding"); got != coding {
		return 0, fmt.Errorf("GET /files: asked for %s, got Content-Encoding %q", coding, got)
	}
	gz, err := gzip.NewReader(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("GET /files: %w", err)
	}
	defer gz.Close()
	return io.Copy(w, gz)
}

// EnvdHealth is GET /health of the sandbox's envd through the gateway.
func (c *Client) EnvdHealth(ctx context.Context, s *Sandbox) error {
	req, err := c.envdRequest(ctx, s, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return &Error{Method: "GET", Path: "envd /health", Status: resp.StatusCode, Body: string(data)}
	}
	return nil
}
