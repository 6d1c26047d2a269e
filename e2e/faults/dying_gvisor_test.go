package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// TestEnvdKilledFromInside kills envd from inside the sandbox, the way code
// running in it as root would (kill -9 of envd's pid from a command),
// while another command streams, for each tier whose envd runs under a
// kernel of its own (gVisor's sentry, the microVM's guest) and for runc.
// Either the kernel refuses (envd is the pid namespace's init, which
// ignores signals from inside) and the sandbox keeps answering, or envd
// dies: then the stream ends with an error instead of hanging, the
// sandbox shows health "error" with the reason, and its owner can kill it,
// which frees everything it held on the host.
func TestEnvdKilledFromInside(t *testing.T) {
	s := harness.Start(t, harness.Name("faults-envd-inside"), harness.Args("--health-interval", "1s"))
	for _, isolation := range []string{"gvisor", "microvm", "container"} {
		t.Run(isolation, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := wire.New(s.URL, s.APIKey)
			before := s.HostState(ctx)
			sb := create(ctx, t, s, isolation)

			ps, err := c.Run(ctx, sb, "root", "ps -eo pid,ppid,user,args")
			if err != nil {
				t.Fatalf("ps: %v", err)
			}
			t.Logf("processes in the sandbox:\n%s", ps.Stdout)
			pid, err := c.Run(ctx, sb, "root", "pgrep -o -x envd")
			if err != nil || pid.ExitCode != 0 || strings.TrimSpace(pid.Stdout) == "" {
				t.Fatalf("envd's pid inside the sandbox: %+v %v", pid, err)
			}
			envd := strings.TrimSpace(pid.Stdout)

			streamEnd := make(chan error, 1)
			go func() {
				r, err := c.Run(ctx, sb, "", "while true; do echo tick; sleep 1; done")
				if err == nil {
					err = fmt.Errorf("the command ended normally: %+v", r)
				}
				streamEnd <- err
			}()
			for {
				r, err := c.Run(ctx, sb, "", "pgrep -f 'sleep 1' >/dev/null")
				if err == nil && r.ExitCode == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatal("the streaming command never started")
				}
			}
			// The killing command may die with envd: its own answer
			// does not matter, what the server reports does.
			kill, kerr := c.Run(ctx, sb, "root", "kill -9 "+envd+"; echo kill=$?")
			t.Logf("kill -9 %s (envd) from inside: %+v %v", envd, kill, kerr)

			if kerr == nil && strings.Contains(kill.Stdout, "kill=") {
				// The command outlived its kill: envd may be the
				// namespace's init, which ignores it.
				if r, err := c.Run(ctx, sb, "", "echo still here"); err == nil && strings.Contains(r.Stdout, "still here") {
					t.Logf("envd survived a kill -9 from inside: %s", kill.Stdout)
					select {
					case err := <-streamEnd:
						t.Errorf("the stream ended although envd lives: %v", err)
					default:
					}
					if err := c.Kill(ctx, sb.SandboxID); err != nil {
						t.Fatalf("kill: %v", err)
					}
					<-streamEnd
					s.WaitNoLeaks(t, before)
					return
				}
			}

			select {
			case err := <-streamEnd:
				t.Logf("the stream ended with: %v", err)
			case <-ctx.Done():
				t.Fatal("the stream of a sandbox whose envd died hangs")
			}
			var last info
			for {
				st, in := getInfo(ctx, t, s, sb.SandboxID)
				if st == http.StatusOK && in.Health == "error" && in.HealthReason != "" {
					last = in
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("envd's death never reported: %d %+v", st, in)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if last.State != "running" && last.State != "paused" {
				t.Errorf("state %q is not one the E2B SDKs know", last.State)
			}
			t.Logf("reported: %s", last.HealthReason)
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				t.Fatalf("kill a sandbox whose envd died: %v", err)
			}
			if st, _ := getInfo(ctx, t, s, sb.SandboxID); st != http.StatusNotFound {
				t.Errorf("after kill: %d, want 404", st)
			}
			s.WaitNoLeaks(t, before)
		})
	}
}

// TestEnvdStoppedFromInside stops envd (SIGSTOP) from inside the sandbox
// as root while commands stream, for each tier. Where the kernel lets the
// signal through (gVisor: envd is init, yet not protected), envd hangs
// without dying: the sandbox shows health "error" naming envd, and when
// its owner kills it every stream ends with an error instead of hanging
// and the host holds nothing of it. Where the kernel ignores the signal,
// the sandbox keeps answering.
func TestEnvdStoppedFromInside(t *testing.T) {
	s := harness.Start(t, harness.Name("faults-envd-stop"), harness.Args("--health-interval", "1s"))
	for _, isolation := range []string{"gvisor", "microvm", "container"} {
		t.Run(isolation, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := wire.New(s.URL, s.APIKey)
			before := s.HostState(ctx)
			sb := create(ctx, t, s, isolation)
			pid, err := c.Run(ctx, sb, "root", "pgrep -o -x envd")
			if err != nil || pid.ExitCode != 0 || strings.TrimSpace(pid.Stdout) == "" {
				t.Fatalf("envd's pid inside the sandbox: %+v %v", pid, err)
			}
			envd := strings.TrimSpace(pid.Stdout)

			streamEnd := make(chan error, 2)
			stream := func(cmd string) {
				r, err := c.Run(ctx, sb, "root", cmd)
				if err == nil {
					err = fmt.Errorf("the command ended normally: %+v", r)
				}
				streamEnd <- err
			}
			go stream("while true; do echo tick; sleep 1; done")
			for {
				r, err := c.Run(ctx, sb, "", "pgrep -f 'sleep 1' >/dev/null")
				if err == nil && r.ExitCode == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatal("the streaming command never started")
				}
			}
			// Its answer comes through envd, which it stops: it is the
			// second stream.
			go stream("kill -STOP " + envd + "; echo stop=$?; sleep infinity")

			var last info
			for {
				st, in := getInfo(ctx, t, s, sb.SandboxID)
				if st == http.StatusOK && in.Health == "error" && in.HealthReason != "" {
					last = in
					break
				}
				// Does envd still answer? A stopped one never does: the
				// probe gives up, and the loop waits for the report.
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				r, err := c.Run(pctx, sb, "", "grep State /proc/"+envd+"/status")
				pcancel()
				if err == nil && strings.Contains(r.Stdout, "State") && !strings.Contains(r.Stdout, "stopped") {
					t.Logf("envd ignored SIGSTOP from inside: %s", r.Stdout)
					last.Health = "answers"
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("a stopped envd never reported: %d %+v", st, in)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if last.Health == "error" {
				t.Logf("reported: %s", last.HealthReason)
				if !strings.Contains(last.HealthReason, "envd") {
					t.Errorf("reason %q does not name envd", last.HealthReason)
				}
				if last.State != "running" {
					t.Errorf("state %q, want running (with health error)", last.State)
				}
			}
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				t.Fatalf("kill a sandbox whose envd is stopped: %v", err)
			}
			for range 2 {
				select {
				case err := <-streamEnd:
					t.Logf("a stream ended with: %v", err)
				case <-ctx.Done():
					t.Fatal("a stream of a killed sandbox hangs")
				}
			}
			if st, _ := getInfo(ctx, t, s, sb.SandboxID); st != http.StatusNotFound {
				t.Errorf("after kill: %d, want 404", st)
			}
			s.WaitNoLeaks(t, before)
		})
	}
}
