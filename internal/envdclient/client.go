// Package envdclient is the host side's typed client of envd, the daemon
// inside every sandbox: health, /init, files and the process service, over
// one http.Client. The sandbox manager is its user; envd's /init handler
// decodes the same Init type.
package envdclient

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Port is the port envd listens on inside every sandbox.
const Port = 49983

// Per-call bounds for the short calls; process streams are bounded by the
// caller's context only (a build step may run for minutes).
const (
	healthTimeout = 5 * time.Second
	// firstHealthAttempt bounds WaitHealthy's first attempts.
	firstHealthAttempt = 100 * time.Millisecond
	callTimeout        = 10 * time.Second
	initRetryFor       = 30 * time.Second
	maxFileBytes       = 8 << 20
)

// NewHTTPClient is the http.Client every envd call of a server shares. No
// keep-alive: sandbox addresses are reused by later sandboxes, and a pooled
// connection to a dead one would hang its successor's start. No proxy: envd
// is on the host's bridge.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
}

// Client talks to the envd of one sandbox.
type Client struct {
	hc    *http.Client
	base  string
	token string
	proc  processconnect.ProcessClient
}

// New returns a client of the envd at ip. token is the sandbox's access
// token, sent with files and process calls ("" for a sandbox without one).
func New(hc *http.Client, ip netip.Addr, token string) *Client {
	base := "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(Port))
	return &Client{hc: hc, base: base, token: token, proc: processconnect.NewProcessClient(hc, base)}
}

// URL is envd's base URL.
func (c *Client) URL() string { return c.base }

// Health asks envd's /health once.
func (c *Client) Health(ctx context.Context) error {
	return c.health(ctx, healthTimeout)
}

// health asks envd's /health once, giving it at most within.
func (c *Client) health(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("health answered %s", resp.Status)
	}
	return nil
}

// WaitHealthy polls /health until envd answers, for at most within. envd is
// usually up within a few ms of the container (or restore) start, so it
// polls tightly at first: the wait is not rounded up.
//
// Each attempt is bounded, from firstHealthAttempt on, doubling each time
// one runs out: a packet of a just-started sandbox's first connection can
// still be lost on a loaded host (the network activates the link before
// the sandbox starts, see internal/network/linkwatch.go), and TCP would
// send its SYN again only after a second; a new attempt sends one at once.
func (c *Client) WaitHealthy(ctx context.Context, within time.Duration) error {
	start, delay, bound := time.Now(), 2*time.Millisecond, firstHealthAttempt
	for {
		err := c.health(ctx, bound)
		if err == nil {
			return nil
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			bound = min(2*bound, healthTimeout)
		}
		if time.Since(start) > within || ctx.Err() != nil {
			return fmt.Errorf("no answer from envd at %s within %s: %w (%w)", c.base, within, err, errdefs.ErrUnavailable)
		}
		time.Sleep(delay)
		if time.Since(start) > 300*time.Millisecond {
			delay = 20 * time.Millisecond
		}
	}
}

// Init sends envd its /init body. auth authorises the call once envd holds
// a token (a restored or running envd); a fresh envd takes its first /init
// without one. A call that got no answer (a loaded host can lose the
// connection) is repeated for up to initRetryFor; if an earlier try took
// effect unseen, envd already holds the new token, and the call is made
// with it.
func (c *Client) Init(ctx context.Context, body Init, auth string) error {
	buf, err := json.Marshal(body)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(initRetryFor)
	retried := false
	for {
		status, msg, err := c.initOnce(ctx, buf, auth)
		if err == nil && status == http.StatusUnauthorized && retried && body.AccessToken != nil && *body.AccessToken != auth {
			status, msg, err = c.initOnce(ctx, buf, *body.AccessToken)
		}
		if err == nil {
			if status/100 != 2 {
				return fmt.Errorf("envd /init answered %d %s: %s", status, http.StatusText(status), msg)
			}
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("envd /init: %w", err)
		}
		retried = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("envd /init: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// initOnce makes one /init call and returns envd's status and message.
func (c *Client) initOnce(ctx context.Context, buf []byte, auth string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/init", bytes.NewReader(buf))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("X-Access-Token", auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, bytes.TrimSpace(msg), nil
}

// ReadFile reads path in the sandbox as user (at most 8 MiB).
func (c *Client) ReadFile(ctx context.Context, path, user string) ([]byte, error) {
	return c.files(ctx, http.MethodGet, path, user, nil)
}

// WriteFile writes path in the sandbox as user, creating parent directories.
func (c *Client) WriteFile(ctx context.Context, path, user string, data []byte) error {
	_, err := c.files(ctx, http.MethodPost, path, user, data)
	return err
}

func (c *Client) files(ctx context.Context, method, path, user string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.fileRequest(ctx, method, path, user, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxFileBytes))
	if err != nil {
		return nil, err
	}
	return out, nil
}

// fileRequest makes one /files call and returns envd's answer; a non-2xx
// answer is an error that quotes envd's message.
func (c *Client) fileRequest(ctx context.Context, method, path, user string, body io.Reader) (*http.Response, error) {
	u := c.base + "/files?" + url.Values{"path": {path}, "username": {user}}.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	c.authorize(req.Header, "")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("envd %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}

// authorize sets envd's user (Basic auth with an empty password, as E2B's
// SDKs send it) and the sandbox's access token.
func (c *Client) authorize(h interface{ Set(string, string) }, user string) {
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	if c.token != "" {
		h.Set("X-Access-Token", c.token)
	}
}

// Command is one shell command run through envd's process service.
type Command struct {
	Cmd     string            // run as /bin/sh -c Cmd
	User    string            // "" = envd's default user
	Workdir string            // "" = envd's default workdir
	Env     map[string]string // on top of the /init environment
}

// ErrNoExit is returned by Run when the process stream ended without the
// process's end event (envd died, the connection broke).
var ErrNoExit = errors.New("process stream ended without an exit")

// Run runs cmd and streams its stdout and stderr to the writers (either may
// be nil) until it ends, returning its exit code. ctx bounds the run.
func (c *Client) Run(ctx context.Context, cmd Command, stdout, stderr io.Writer) (int, error) {
	stdin := false
	cfg := &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd.Cmd}, Envs: cmd.Env}
	if cmd.Workdir != "" {
		cfg.Cwd = &cmd.Workdir
	}
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin})
	c.authorize(req.Header(), cmd.User)
	stream, err := c.proc.Start(ctx, req)
	if err != nil {
		return -1, err
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			if b := d.GetStdout(); len(b) > 0 && stdout != nil {
				_, _ = stdout.Write(b)
			}
			if b := d.GetStderr(); len(b) > 0 && stderr != nil {
				_, _ = stderr.Write(b)
			}
		}
		if end := ev.GetEnd(); end != nil {
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, err
	}
	return -1, ErrNoExit
}
