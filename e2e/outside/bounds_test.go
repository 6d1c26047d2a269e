package outside

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestBoundsAttacks: a team fills what it can make through the API (build
// uploads, idempotency keys, MCP calls and their output) past its bounds;
// each refuses with an error naming the quota's flag, and no other team
// loses anything to it.
func TestBoundsAttacks(t *testing.T) {
	srv := harness.Start(t, harness.Name("bounds"),
		harness.Args("--idempotency-keys-per-team", "3", "--mcp-calls-per-team", "2", "--gateway-max-per-sandbox", "4",
			"--build-requests-per-team", "3"))
	s := &target{Server: srv, OtherKey: srv.NewKey(t, "bounds-b")}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	runAttacks(t, []attack{
		{side: sideTenant, name: "streams held open to one sandbox past --gateway-max-per-sandbox", run: func(t *testing.T) error {
			id := s.teamASandbox(ctx, t)
			sbx, err := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey)).Connect(ctx, id, 0)
			if err != nil {
				return err
			}
			holdCtx, stop := context.WithCancel(ctx)
			defer stop()
			for i := range 4 {
				if _, err := sbx.Commands.Start(holdCtx, "sleep 300"); err != nil {
					return fmt.Errorf("stream %d within the bound: %w", i, err)
				}
			}
			st, body, err := health(ctx, s, id)
			switch {
			case err != nil:
				return err
			case st != http.StatusServiceUnavailable:
				return crossed("a fifth request to a sandbox holding 4 streams (bound 4): %d %.120s", st, body)
			case !strings.Contains(body, "--gateway-max-per-sandbox"):
				return fmt.Errorf("the refusal does not name the flag: %.200s", body)
			}
			// Another team's sandbox is not held up.
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120})
			if err != nil || st != http.StatusCreated {
				return fmt.Errorf("team B creates a sandbox: %d %s %v", st, b, err)
			}
			other := jsonField(t, b, "sandboxID")
			defer s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/sandboxes/"+other, nil)
			if st, body, err := health(ctx, s, other); err != nil || st != http.StatusNoContent {
				return crossed("team B's sandbox refused while team A's is at its bound: %d %.120s %v", st, body, err)
			}
			// The streams end with their requests and free their places.
			stop()
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
				if st, _, err := health(ctx, s, id); err == nil && st == http.StatusNoContent {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the sandbox's places were not freed a minute after its streams ended")
				}
			}
		}},
		{side: sideTenant, name: "build requests never started past --build-requests-per-team", run: func(t *testing.T) error {
			// A team of its own: the other rows request builds too.
			third := srv.NewKey(t, "bounds-c")
			request := func(key string, i int) (int, string, error) {
				st, b, err := s.Do(ctx, key, http.MethodPost, "/v3/templates", map[string]any{"name": fmt.Sprintf("unstarted-%d", i)})
				return st, string(b), err
			}
			for i := range 3 {
				if st, b, err := request(third, i); err != nil || st != http.StatusAccepted {
					return fmt.Errorf("build request %d within the bound: %d %.200s %v", i, st, b, err)
				}
			}
			st, b, err := request(third, 3)
			switch {
			case err != nil:
				return err
			case st != http.StatusTooManyRequests:
				return crossed("a fourth unstarted build request (bound 3): %d %.120s", st, b)
			case !strings.Contains(b, "--build-requests-per-team"):
				return fmt.Errorf("the refusal does not name the flag: %.200s", b)
			}
			if st, b, err := request(s.APIKey, 100); err != nil || st != http.StatusAccepted {
				return crossed("team A refused while team C is at its bound: %d %.200s %v", st, b, err)
			}
			return nil
		}},
		{side: sideTenant, name: "33 uploads of 8 MiB against a 256 MiB upload quota", run: func(t *testing.T) error {
			tb, err := requestBuild(ctx, t, s, s.APIKey, "bounds-uploads")
			if err != nil {
				return err
			}
			body := make([]byte, 8<<20)
			for i := 1; i <= 33; i++ {
				st, b, err := tb.upload(fmt.Sprintf("%064x", i), body, false)
				if err != nil {
					return fmt.Errorf("upload %d: %w", i, err)
				}
				switch {
				case i < 33 && st != http.StatusOK:
					return fmt.Errorf("upload %d within the quota: %d %.160s", i, st, b)
				case i == 33 && st == http.StatusOK:
					return crossed("the 33rd 8 MiB upload was stored past the team's 256 MiB")
				case i == 33 && (st != http.StatusTooManyRequests || !strings.Contains(string(b), "--upload-team-max-size")):
					return fmt.Errorf("the 33rd upload: %d %.200s, want 429 naming --upload-team-max-size", st, b)
				}
			}
			// Another team's quota is its own.
			other, err := requestBuild(ctx, t, s, s.OtherKey, "bounds-uploads-b")
			if err != nil {
				return err
			}
			if st, b, err := other.upload(fmt.Sprintf("%064x", 1), body, false); err != nil || st != http.StatusOK {
				return crossed("team B's upload refused after team A filled its quota: %d %.160s %v", st, b, err)
			}
			return nil
		}},
		{side: sideTenant, name: "team A fills its idempotency cache to evict team B's key", run: func(t *testing.T) error {
			create := func(key, idem string) (string, error) {
				st, b, err := s.DoHeader(ctx, key, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120},
					http.Header{"Idempotency-Key": {idem}})
				if err != nil {
					return "", err
				}
				if st != http.StatusCreated {
					return "", fmt.Errorf("create with %s: %d %.160s", idem, st, b)
				}
				id := jsonField(t, b, "sandboxID")
				// The answer is remembered; the sandbox need not live on.
				_, _, _ = s.Do(ctx, key, http.MethodDelete, "/sandboxes/"+id, nil)
				return id, nil
			}
			first, err := create(s.OtherKey, "b-create")
			if err != nil {
				return err
			}
			for i := range 5 {
				if _, err := create(s.APIKey, fmt.Sprint("a-create-", i)); err != nil {
					return err
				}
			}
			again, err := create(s.OtherKey, "b-create")
			if err != nil {
				return err
			}
			if again != first {
				return crossed("team B's retry made a new sandbox %s (first %s): team A's keys evicted B's", again, first)
			}
			return nil
		}},
		{side: sideTenant, name: "MCP run_command output past the cap", run: func(t *testing.T) error {
			id := s.teamASandbox(ctx, t)
			st, isErr, text, err := mcpCall(ctx, s.Server, s.APIKey, "run_command",
				map[string]any{"sandboxId": id, "cmd": "head -c 5000000 /dev/zero | tr '\\0' x"})
			switch {
			case err != nil:
				return err
			case st != http.StatusOK || isErr:
				return fmt.Errorf("run_command: %d %.200s", st, text)
			case len(text) > 2<<20:
				return crossed("the tool answered %d bytes of output, past its 1 MiB cap", len(text))
			case !strings.Contains(text, `"truncated":true`):
				return fmt.Errorf("cut output not marked truncated: %.200s", text)
			}
			return nil
		}},
		{side: sideTenant, name: "MCP calls past the team's limit, then cancelled with their request", run: func(t *testing.T) error {
			id := s.teamASandbox(ctx, t)
			sbx, err := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey)).Connect(ctx, id, 0)
			if err != nil {
				return err
			}
			callCtx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() {
					_, _, _, _ = mcpCall(callCtx, s.Server, s.APIKey, "run_command",
						map[string]any{"sandboxId": id, "cmd": "sleep 300", "timeoutSeconds": 310})
				})
			}
			defer wg.Wait()
			defer stop()
			// Wait until both calls run their command.
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
				res, err := sbx.Commands.Run(ctx, "pgrep -c -x sleep || true")
				if err == nil && strings.TrimSpace(res.Stdout) == "2" {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the two held calls did not start: %v %v", res, err)
				}
			}
			st, _, text, err := mcpCall(ctx, s.Server, s.APIKey, "list_sandboxes", map[string]any{})
			if err != nil {
				return err
			}
			if st != http.StatusTooManyRequests {
				return crossed("a third MCP call of team A with 2 under way (limit 2): %d %.160s", st, text)
			}
			if !strings.Contains(text, "--mcp-calls-per-team") {
				return fmt.Errorf("the refusal does not name the flag: %.200s", text)
			}
			if st, isErr, text, err := mcpCall(ctx, s.Server, s.OtherKey, "list_sandboxes", map[string]any{}); err != nil || st != http.StatusOK || isErr {
				return crossed("team B's MCP call refused while team A is at its limit: %d %.160s %v", st, text, err)
			}
			// The held calls end with their requests, and free their slots.
			stop()
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
				st, _, text, err := mcpCall(ctx, s.Server, s.APIKey, "list_sandboxes", map[string]any{})
				if err == nil && st == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					return crossed("team A's MCP calls still held 2 minutes after their requests went away: %d %.160s %v", st, text, err)
				}
			}
			return nil
		}},
	})
}

// health asks envd's health of sandbox id through the gateway (no
// credential needed): 204 when it answers.
func health(ctx context.Context, s *target, id string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(agentbox.EnvdPort))
	return send(http.DefaultClient, req)
}

// TestUploadExpiryAttack: an upload no build uses is removed after
// --upload-ttl (here 2 s), from the disk and from the API's view.
func TestUploadExpiryAttack(t *testing.T) {
	srv := harness.Start(t, harness.Name("bounds-ttl"), harness.Args("--upload-ttl", "2s"))
	s := &target{Server: srv}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runAttacks(t, []attack{{side: sideTenant, name: "an unused upload outlives --upload-ttl", run: func(t *testing.T) error {
		tb, err := requestBuild(ctx, t, s, s.APIKey, "bounds-expiry")
		if err != nil {
			return err
		}
		hash := strings.Repeat("e", 64)
		if st, b, err := tb.upload(hash, []byte("unused"), false); err != nil || st != http.StatusOK {
			return fmt.Errorf("upload: %d %s %v", st, b, err)
		}
		stored := func() (bool, error) {
			m, err := filepath.Glob(filepath.Join(s.TemplateDir, ".uploads", "*", hash+".*"))
			return len(m) > 0, err
		}
		if ok, err := stored(); err != nil || !ok {
			return fmt.Errorf("the upload is not on the disk: %v", err)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
			ok, err := stored()
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if !ok {
				break
			}
			if time.Now().After(deadline) {
				return crossed("the unused upload is still stored a minute after its 2 s TTL")
			}
		}
		st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/templates/"+tb.templateID+"/files/"+hash, nil)
		if err != nil {
			return err
		}
		if st != http.StatusCreated || strings.Contains(string(b), `"present":true`) {
			return crossed("the API still offers the expired upload: %d %s", st, b)
		}
		return nil
	}}})
}
