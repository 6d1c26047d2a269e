package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// envd is the sandbox's init and its server in one process: the orphans
// that fall to it are reaped while its commands keep their exit statuses,
// on both container tiers. Under runc sandbox root cannot kill it (the
// kernel drops SIGKILL and SIGSTOP sent to a PID namespace's init from
// inside); gVisor delivers them, and the sandbox then reports its end.
func TestEnvdIsInit(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	root := agentbox.WithUser("root")
	for _, tier := range []string{"container", "gvisor"} {
		t.Run(tier, func(t *testing.T) {
			opts := agentbox.CreateOptions{Template: "base", Timeout: 5 * time.Minute}
			if tier == "gvisor" {
				opts.Metadata = map[string]string{"agentbox.isolation": "gvisor"}
			}
			sbx, err := c.Create(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sbx.Kill(context.Background()) }()
			runOut := func(script string) string {
				t.Helper()
				res, err := sbx.Commands.Run(ctx, script, root)
				if err != nil {
					t.Fatalf("%q: %v", script, err)
				}
				return strings.TrimSpace(res.Stdout)
			}

			// One envd process: PID 1, and no second envd but the spare
			// reapers and this command's reaper ("envd reap").
			if got := runOut(`cat /proc/1/comm; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = envd ] && tr '\0' ' ' < $p/cmdline && echo; done | grep -vc ' reap ' || true`); got != "envd\n1" {
				t.Fatalf("PID 1 and envd processes besides reapers: %q, want envd and 1", got)
			}
			// Orphans: under the command's reaper, and straight to PID 1
			// when the command kills its reaper.
			runOut(`bash -c 'sleep 1 & exit'`)
			for range 3 {
				_, _ = sbx.Commands.Run(ctx, `(sleep 1 &); true & kill -9 $PPID`, root)
			}
			for i := range 10 {
				res, err := sbx.Commands.Run(ctx, fmt.Sprintf("true & exit %d", i+1), root)
				if _, ok := errors.AsType[*agentbox.CommandExitError](err); !ok || res.ExitCode != i+1 {
					t.Fatalf("exit %d: %+v, %v", i+1, res, err)
				}
			}
			// Every orphan ends and is reaped.
			deadline := time.Now().Add(30 * time.Second)
			for {
				got := runOut(`echo "$(pgrep -xc sleep) $(ps -eo stat= | grep -c '^Z')"`)
				if got == "0 0" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sleeping orphans and zombies: %q, want 0 0\n%s", got, runOut(`ps -eo pid,ppid,stat,args`))
				}
				time.Sleep(200 * time.Millisecond)
			}

			if tier == "container" {
				// Sandbox root cannot stop or kill envd.
				runOut(`kill -STOP 1; kill -KILL 1; echo sent`)
				if got := runOut(`echo alive; cat /proc/1/comm`); got != "alive\nenvd" {
					t.Fatalf("after kill -9 1: %q", got)
				}
				return
			}
			// gVisor delivers a SIGKILL to init from inside: sandbox root
			// can end its own sandbox, and the sandbox's health says so.
			_, _ = sbx.Commands.Run(ctx, `kill -KILL 1`, root)
			deadline = time.Now().Add(2 * time.Minute)
			for {
				var info struct {
					Health       string `json:"health"`
					HealthReason string `json:"healthReason"`
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/sandboxes/"+sbx.ID, nil)
				req.Header.Set("X-API-Key", s.APIKey)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_ = json.NewDecoder(resp.Body).Decode(&info)
					resp.Body.Close()
				}
				if info.Health == "error" && strings.Contains(info.HealthReason, "envd") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after kill -9 1 on gvisor: health %q (%s), want error naming envd", info.Health, info.HealthReason)
				}
				time.Sleep(time.Second)
			}
		})
	}
}
