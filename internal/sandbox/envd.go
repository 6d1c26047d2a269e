package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
)

// envdLink is how the server talks to sandboxes' envd: the HTTP client
// (direct, not through the gateway), the secret access tokens derive from,
// and what every /init hands a sandbox. It holds no records: callers pass
// the sandbox they mean.
type envdLink struct {
	client    *http.Client
	secret    []byte
	readyWait time.Duration // the server's wait for envd after a start
	net       Network       // its egress CA, when header rules need one
}

// token is sandbox id's envd access token.
func (e *envdLink) token(id string) string { return AccessToken(e.secret, id) }

// of is the client of sb's envd, carrying sb's access token.
func (e *envdLink) of(sb *Sandbox) *envdclient.Client {
	return envdclient.New(e.client, sb.IP, e.held(sb))
}

// init waits for a freshly booted envd's /health, then hands it the
// sandbox's env vars, default user/workdir, command cap, the template's
// start command (which envd starts in the background) and, for secure
// sandboxes, its access token.
func (e *envdLink) init(ctx context.Context, sb *Sandbox, startCmd string, pol network.Policy) error {
	c := e.of(sb)
	if err := c.WaitHealthy(ctx, e.readyWaitOf(sb)); err != nil {
		return err
	}
	// Before /init: the start command (the code interpreter's kernels)
	// reads the CA files that envdEnv names when it starts.
	if err := e.installCA(ctx, sb, pol); err != nil {
		return err
	}
	body := e.initBody(sb)
	body.StartCmd = startCmd
	if !sb.Secure {
		body.AccessToken = nil // a fresh envd has none; keep it so
	}
	return c.Init(ctx, body, "")
}

// readyWaitOf is how long sb's envd may take to answer after its start:
// the server's wait, or more where the tier boots a kernel first.
func (e *envdLink) readyWaitOf(sb *Sandbox) time.Duration {
	ti, _ := runtime.TierOf(sb.Isolation)
	return max(e.readyWait, ti.ReadyWait)
}

// reinit hands a restored or claimed envd its new identity: env vars,
// command cap, and the access token of the new sandbox. Its memory holds
// the token of the sandbox it was checkpointed from (or made for), auth,
// which authorises this call.
func (e *envdLink) reinit(ctx context.Context, sb *Sandbox, auth string, pol network.Policy) error {
	c := envdclient.New(e.client, sb.IP, auth)
	if err := c.WaitHealthy(ctx, e.readyWaitOf(sb)); err != nil {
		return fmt.Errorf("restored envd: %w", err)
	}
	if err := e.installCAWith(ctx, c, sb, pol); err != nil {
		return err
	}
	return c.Init(ctx, e.initBody(sb), auth)
}

// initBody is sb's /init: everything envd must know of the sandbox.
func (e *envdLink) initBody(sb *Sandbox) envdclient.Init {
	token := e.held(sb)
	return envdclient.Init{
		EnvVars: e.env(sb), AccessToken: &token,
		DefaultUser: sb.DefaultUser, DefaultWorkdir: sb.DefaultWorkdir,
		MaxCommandSeconds: sb.MaxCommandSeconds,
		Timestamp:         time.Now().UTC().Format(time.RFC3339Nano),
	}
}

// Ready-check timing: the first attempt runs at once, then every
// readyInterval until readyTimeout (a template's start command may take a
// while, e.g. Jupyter).
const (
	readyInterval = 250 * time.Millisecond
	readyTimeout  = 120 * time.Second
)

// waitReady runs the template's ready command in the sandbox until it exits
// 0. On timeout it fails with the command's last output and exit code, so
// the create call reports why the template never became ready.
func (e *envdLink) waitReady(ctx context.Context, sb *Sandbox, readyCmd string) error {
	if strings.TrimSpace(readyCmd) == "" {
		return nil
	}
	c := e.of(sb)
	deadline := time.Now().Add(readyTimeout)
	var last string
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out := &capped{max: 4096}
		code, err := c.Run(actx, envdclient.Command{Cmd: readyCmd, User: sb.DefaultUser, Workdir: sb.DefaultWorkdir}, out, out)
		cancel()
		if err == nil && code == 0 {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("exit code %d: %s", code, strings.TrimSpace(out.String()))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ready check %q did not pass within %s (%d attempts); last: %s: %w",
				readyCmd, readyTimeout, attempt, last, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
		case <-time.After(readyInterval):
		}
	}
}

// capped keeps the first max bytes written to it.
type capped struct {
	bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
