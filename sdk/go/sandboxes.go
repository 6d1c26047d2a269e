package agentbox

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
)

// CreateOptions describe a new sandbox. Zero fields take the server's defaults.
type CreateOptions struct {
	// Template is a template ID or alias; default "base".
	Template string
	// Timeout is how long the sandbox lives before it is killed; rounded up
	// to whole seconds. Zero means the server default (300 s).
	Timeout time.Duration
	// Metadata is echoed by List and GetInfo and filters List.
	Metadata map[string]string
	// EnvVars are set for every process in the sandbox.
	EnvVars map[string]string
	// AllowInternetAccess false denies all outbound traffic; nil = server default.
	AllowInternetAccess *bool
	// Network is the sandbox's network policy (allowOut, denyOut, ...); nil
	// = outbound allowed unless AllowInternetAccess is false, ports public.
	Network *rest.SandboxNetworkConfig
	// Secure false asks for a sandbox whose envd takes no access token (the
	// legacy v1 create call). nil or true: secured, the default.
	Secure *bool
}

// Sandbox is a running sandbox and the entry point to its data plane.
type Sandbox struct {
	ID                 string
	TemplateID         string
	Alias              string
	EnvdVersion        string
	EnvdAccessToken    string
	TrafficAccessToken string

	Commands *Commands // processes
	PTY      *PTY      // interactive terminals
	Files    *Files    // the filesystem

	client *Client
	dp     *dataPlane
}

// SandboxInfo describes a sandbox as List and GetInfo report it.
type SandboxInfo = rest.ListedSandbox

// SandboxMetric is one resource sample of a sandbox; byte counts.
type SandboxMetric rest.SandboxMetric

// Time is the sample's timestamp.
func (m SandboxMetric) Time() time.Time { return time.Unix(m.TimestampUnix, 0) }

// TemplateInfo describes a template the server can start sandboxes from.
type TemplateInfo = rest.Template

// ListOptions filter List.
type ListOptions struct {
	Metadata map[string]string // exact match on every pair
	State    []string          // "running", "paused"; empty = both
	Limit    int               // at most this many sandboxes; 0 = all
}

// seconds is d rounded up to whole seconds, for the wire's timeouts.
func seconds(d time.Duration) *int64 {
	return ptr(int64(math.Ceil(d.Seconds())))
}

func ptr[T any](v T) *T { return &v }

// Create starts a sandbox and returns once it is ready for commands.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	if opts.Template == "" {
		opts.Template = "base"
	}
	body := rest.NewSandbox{TemplateID: opts.Template, Metadata: opts.Metadata, EnvVars: opts.EnvVars,
		AllowInternetAccess: opts.AllowInternetAccess, Network: opts.Network}
	if opts.Timeout > 0 {
		body.Timeout = seconds(opts.Timeout)
	}
	path := "/v2/sandboxes"
	if opts.Secure != nil {
		// Only the v1 call can turn the access token off.
		path = "/sandboxes"
		body.Secure = opts.Secure
		if opts.Timeout <= 0 {
			body.Timeout = ptr(int64(300))
		}
	}
	var w rest.Sandbox
	if _, err := c.do(ctx, http.MethodPost, path, body, &w, http.StatusCreated, http.StatusOK); err != nil {
		return nil, fmt.Errorf("create sandbox from %q: %w", opts.Template, err)
	}
	return c.newSandbox(w), nil
}

// Connect attaches to an existing sandbox, resuming it if paused, and
// extends its life to at least timeout from now (zero: server default).
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	var body rest.ConnectSandbox
	if timeout > 0 {
		body.Timeout = seconds(timeout)
	}
	var w rest.Sandbox
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", body, &w,
		http.StatusOK, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("connect to sandbox %s: %w", id, err)
	}
	return c.newSandbox(w), nil
}

// List returns the sandboxes matching opts, following pagination.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]SandboxInfo, error) {
	q := url.Values{}
	if len(opts.Metadata) > 0 {
		// As the e2b SDKs send it: each key and value encoded, then the
		// pairs, then (by q.Encode) the parameter.
		md := url.Values{}
		for k, v := range opts.Metadata {
			md.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		q.Set("metadata", md.Encode())
	}
	if len(opts.State) > 0 {
		q.Set("state", strings.Join(opts.State, ","))
	}
	var all []SandboxInfo
	for {
		page := 100
		if opts.Limit > 0 {
			page = min(page, opts.Limit-len(all))
		}
		q.Set("limit", strconv.Itoa(page))
		var batch []SandboxInfo
		resp, err := c.do(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &batch, http.StatusOK)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		all = append(all, batch...)
		next := resp.Header.Get("X-Next-Token")
		if next == "" || len(batch) == 0 || (opts.Limit > 0 && len(all) >= opts.Limit) {
			break
		}
		q.Set("nextToken", next)
	}
	if opts.Limit > 0 && len(all) > opts.Limit {
		all = all[:opts.Limit]
	}
	return all, nil
}

// GetInfo describes one sandbox.
func (c *Client) GetInfo(ctx context.Context, id string) (*SandboxInfo, error) {
	var info SandboxInfo
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &info, http.StatusOK); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return &info, nil
}

// Kill stops a sandbox and deletes it (also when paused).
func (c *Client) Kill(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil,
		http.StatusNoContent, http.StatusOK); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	return nil
}

// Pause checkpoints a running sandbox (memory, processes and files) until
// Connect resumes it.
func (c *Client) Pause(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil,
		http.StatusNoContent, http.StatusOK); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// SetTimeout makes the sandbox end d from now; it may shorten its life.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	body := rest.TimeoutRequest{Timeout: seconds(d)}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", body, nil,
		http.StatusNoContent, http.StatusOK); err != nil {
		return fmt.Errorf("set timeout of sandbox %s: %w", id, err)
	}
	return nil
}

// Metrics returns the sandbox's recent resource samples, oldest first.
func (c *Client) Metrics(ctx context.Context, id string) ([]SandboxMetric, error) {
	var m []SandboxMetric
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/metrics", nil, &m, http.StatusOK); err != nil {
		return nil, fmt.Errorf("metrics of sandbox %s: %w", id, err)
	}
	return m, nil
}

// ListTemplates returns the templates sandboxes can be created from.
func (c *Client) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	var t []TemplateInfo
	if _, err := c.do(ctx, http.MethodGet, "/templates", nil, &t, http.StatusOK); err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return t, nil
}

// Kill stops and deletes the sandbox.
func (s *Sandbox) Kill(ctx context.Context) error { return s.client.Kill(ctx, s.ID) }

// SetTimeout makes the sandbox end d from now.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	return s.client.SetTimeout(ctx, s.ID, d)
}

// GetInfo describes the sandbox.
func (s *Sandbox) GetInfo(ctx context.Context) (*SandboxInfo, error) {
	return s.client.GetInfo(ctx, s.ID)
}

// Metrics returns the sandbox's recent resource samples.
func (s *Sandbox) Metrics(ctx context.Context) ([]SandboxMetric, error) {
	return s.client.Metrics(ctx, s.ID)
}
