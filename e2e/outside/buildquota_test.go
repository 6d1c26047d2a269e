package outside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestBuildQuotaAttacks: the author of a build against the team's quota. A
// RUN step runs inside the team's memory and disk quota (and sees its
// limit in its cgroup), and a running build holds one of the team's build
// and sandbox slots until it ends, a server restart included.
func TestBuildQuotaAttacks(t *testing.T) {
	hs := harness.Start(t, harness.Name("build-quota"))
	s := &target{Server: hs}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const team, quotaMB = "build-quota", 128
	key := hs.NewKey(t, team)
	quota := func(args ...string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, hs.Bin, append(append([]string{"team", "quota", "set", team}, args...), "--data-dir", hs.DataDir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("team quota set %v: %v\n%s", args, err, out)
		}
	}
	mb := strconv.Itoa(quotaMB)
	quota("--memory-mb", mb, "--disk-mb", mb)

	build := func(name string, steps ...string) (string, *templateBuild, error) {
		b, err := requestBuild(ctx, t, s, key, name)
		if err != nil {
			return "", nil, err
		}
		var st []map[string]any
		for _, c := range steps {
			st = append(st, map[string]any{"type": "RUN", "args": []string{c, "root"}})
		}
		res, err := b.run("base", st)
		return res, b, err
	}
	runAttacks(t, []attack{
		{sideBuild, "RUN step allocates past the team's memory quota", func(t *testing.T) error {
			// tail buffers a line with no end: 400 MiB of memory. It ends
			// the pipeline, so the step fails if it is killed.
			res, _, err := build("bq-memory", "head -c 400M /dev/zero | tail >/dev/null")
			switch {
			case err != nil:
				return err
			case res == "ready":
				return crossed("a step holding 400 MiB succeeded under a %d MiB quota", quotaMB)
			case !strings.Contains(res, fmt.Sprintf("memory quota of %d MiB", quotaMB)) || !strings.Contains(res, "--memory-mb"):
				return crossed("failed without naming the memory quota: %.300s", res)
			}
			return nil
		}},
		{sideBuild, "RUN step reads its cgroup memory limit", func(t *testing.T) error {
			// cgroup v1 and v2; "max" (v2) or a huge number (v1) is no limit.
			// "LIM""IT=" keeps the step's own log line from matching.
			res, b, err := build("bq-cgroup", `echo "LIM""IT=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)"`)
			if err != nil {
				return err
			}
			if res != "ready" {
				return fmt.Errorf("build: %s", res)
			}
			_, body, err := s.Do(ctx, key, http.MethodGet, "/templates/"+b.templateID+"/builds/"+b.buildID+"/logs", nil)
			if err != nil {
				return err
			}
			var logs struct{ Logs []struct{ Message string } }
			if err := json.Unmarshal(body, &logs); err != nil {
				return fmt.Errorf("logs: %v: %.200s", err, body)
			}
			re := regexp.MustCompile(`LIMIT=(\S+)`)
			for _, l := range logs.Logs {
				if m := re.FindStringSubmatch(l.Message); m != nil {
					n, err := strconv.ParseUint(m[1], 10, 64)
					if err != nil || n > quotaMB<<20 {
						return crossed("the step's cgroup memory limit is %s, over the team's %d MiB", m[1], quotaMB)
					}
					return nil
				}
			}
			return fmt.Errorf("no LIMIT= line in the build log: %.300s", body)
		}},
		{sideBuild, "RUN step writes past the team's disk quota", func(t *testing.T) error {
			res, _, err := build("bq-disk", "head -c 300M /dev/zero > /big && ls -l /big")
			switch {
			case err != nil:
				return err
			case res == "ready":
				return crossed("a step wrote 300 MiB under a %d MiB disk quota", quotaMB)
			case !strings.Contains(res, fmt.Sprintf("wrote more than the team's disk quota of %d MiB", quotaMB)) || !strings.Contains(res, "--disk-mb"):
				return crossed("failed without naming the disk quota: %.300s", res)
			}
			return nil
		}},
		{sideBuild, "builds past the team's build and sandbox limits", func(t *testing.T) error {
			quota("--max-builds", "1")
			// A build that runs until the server stops.
			slow, err := requestBuild(ctx, t, s, key, "bq-slow")
			if err != nil {
				return err
			}
			path := "/templates/" + slow.templateID + "/builds/" + slow.buildID
			st, body, err := s.Do(ctx, key, http.MethodPost, "/v2"+path, map[string]any{"fromTemplate": "base",
				"steps": []map[string]any{{"type": "RUN", "args": []string{"while :; do sleep 1; done", "root"}}}})
			if err != nil || st != http.StatusAccepted {
				return fmt.Errorf("start the slow build: %d %s %v", st, body, err)
			}
			// Wait until its step runs.
			for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
				_, body, err := s.Do(ctx, key, http.MethodGet, path+"/logs", nil)
				if err != nil {
					return err
				}
				if strings.Contains(string(body), "step sandbox:") {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the slow build's step did not start: %.300s", body)
				}
			}
			second, err := requestBuild(ctx, t, s, key, "bq-second")
			if err != nil {
				return err
			}
			start := func() (int, string) {
				st, body, err := s.Do(ctx, key, http.MethodPost, "/v2/templates/"+second.templateID+"/builds/"+second.buildID,
					map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"true", "root"}}}})
				if err != nil {
					t.Fatal(err)
				}
				return st, string(body)
			}
			if st, body := start(); st != http.StatusTooManyRequests || !strings.Contains(body, "maxBuilds") || !strings.Contains(body, "--max-builds") {
				if st/100 == 2 {
					return crossed("a second build started past maxBuilds 1: %d", st)
				}
				return fmt.Errorf("second build past maxBuilds: %d %s, want a 429 naming maxBuilds", st, body)
			}
			// Builds allowed, sandboxes not: the running build holds the one.
			quota("--max-builds", "2", "--max-sandboxes", "1")
			if st, body := start(); st != http.StatusTooManyRequests || !strings.Contains(body, "maxSandboxes") {
				if st/100 == 2 {
					return crossed("a second build started past maxSandboxes 1: %d", st)
				}
				return fmt.Errorf("second build past maxSandboxes: %d %s, want a 429 naming maxSandboxes", st, body)
			}
			st, body, err = s.Do(ctx, key, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 60})
			if err != nil {
				return err
			}
			if st/100 == 2 {
				_, _, _ = s.Do(ctx, key, http.MethodDelete, "/sandboxes/"+jsonField(t, body, "sandboxID"), nil)
				return crossed("a sandbox was created while a build held the team's only slot")
			}
			// A restart ends the slow build and frees its slot.
			hs.Restart(t)
			if res, err := slow.wait(); err != nil || !strings.Contains(res, "restart") {
				return fmt.Errorf("the slow build after a restart: %q %v", res, err)
			}
			if st, body := start(); st != http.StatusAccepted {
				return crossed("the interrupted build still holds the slot after a restart: %d %s", st, body)
			}
			if res, err := second.wait(); err != nil || res != "ready" {
				return fmt.Errorf("the second build: %q %v", res, err)
			}
			return nil
		}},
	})
}
