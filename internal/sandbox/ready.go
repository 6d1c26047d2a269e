package sandbox

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/errdefs"
)

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
func (m *Manager) waitReady(ctx context.Context, sb *Sandbox, readyCmd string) error {
	if strings.TrimSpace(readyCmd) == "" {
		return nil
	}
	base := "http://" + net.JoinHostPort(sb.IP.String(), strconv.Itoa(EnvdPort))
	client := processconnect.NewProcessClient(&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}, base)
	deadline := time.Now().Add(readyTimeout)
	var last string
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		code, out, err := m.runOnce(actx, client, sb, readyCmd)
		cancel()
		if err == nil && code == 0 {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("exit code %d: %s", code, strings.TrimSpace(out))
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

// runOnce runs cmd through a shell as the sandbox's default user and
// returns its exit code and combined output (at most 4 KiB).
func (m *Manager) runOnce(ctx context.Context, client processconnect.ProcessClient, sb *Sandbox, cmd string) (int, string, error) {
	stdin := false
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Cwd: &sb.DefaultWorkdir},
		Stdin:   &stdin,
	})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(sb.DefaultUser+":")))
	if sb.Secure {
		req.Header().Set("X-Access-Token", m.Token(sb.ID))
	}
	stream, err := client.Start(ctx, req)
	if err != nil {
		return -1, "", err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil && out.Len() < 4096 {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return int(end.GetExitCode()), out.String(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, out.String(), err
	}
	return -1, out.String(), fmt.Errorf("process stream ended without an exit")
}

// mergeEnv is the template's env overlaid with the request's: a sandbox
// sees its template's ENV, and a create call can override any of it.
func mergeEnv(tpl, req map[string]string) map[string]string {
	if len(tpl) == 0 {
		return req
	}
	out := maps.Clone(tpl)
	maps.Copy(out, req)
	return out
}
