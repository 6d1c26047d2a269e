package outside

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestSSHAttacks: `agentbox ssh --stdio` (OpenSSH's ProxyCommand) reaches
// a sandbox only with a key of the sandbox's team: the SSH layer asks for
// no credential of its own, so everything rests on the API's key check and
// the data plane's access token, and a refused caller's command never runs
// and a paused sandbox stays paused.
func TestSSHAttacks(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("the OpenSSH client is needed (scripts/install-deps.sh installs openssh-client)")
	}
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)
	paused := s.teamASandbox(ctx, t)
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+paused+"/pause", nil); err != nil || st != http.StatusNoContent {
		t.Fatalf("pause: %d %s %v", st, b, err)
	}
	state := func(id string) string {
		st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+id, nil)
		if err != nil || st != http.StatusOK {
			t.Fatalf("info: %d %s %v", st, b, err)
		}
		return jsonField(t, b, "state")
	}
	// marked reports whether the attack's command ran in sandbox id.
	marked := func(t *testing.T, id, marker string) bool {
		out, err := exec.CommandContext(ctx, s.Bin, "exec", "--api-url", s.URL, "--api-key", s.APIKey, id, "--",
			"test -e /tmp/"+marker+" && echo yes || echo no").CombinedOutput()
		if err != nil {
			t.Fatalf("team A checks its sandbox: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out)) == "yes"
	}
	n := 0
	// attempt runs `touch /tmp/<marker>` in target over OpenSSH with key
	// ("" for none); the attack crosses if ssh succeeded or the marker
	// exists in check (a sandbox of team A).
	attempt := func(key, target, check string) func(t *testing.T) error {
		return func(t *testing.T) error {
			n++
			marker := fmt.Sprintf("ssh-attack-%d", n)
			cmd := exec.CommandContext(ctx, "ssh", "-F", "/dev/null",
				"-o", "ProxyCommand="+s.Bin+" ssh --stdio %h", "-o", "StrictHostKeyChecking=no",
				"-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
				"user@"+target, "touch /tmp/"+marker)
			// Only the key given: none from the environment or a data dir.
			env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "AGENTBOX_DATA_DIR=" + t.TempDir(), "E2B_API_URL=" + s.URL}
			if key != "" {
				env = append(env, "E2B_API_KEY="+key)
			}
			cmd.Env = env
			var errb bytes.Buffer
			cmd.Stderr = &errb
			err := cmd.Run()
			if err == nil {
				return crossed("ssh ran the command")
			}
			if check == paused {
				if st := state(paused); st != "paused" {
					return crossed("the paused sandbox is now %s", st)
				}
				return nil
			}
			if check != "" && marked(t, check, marker) {
				return crossed("the command ran in the sandbox: %s", oneLine(errb.String()))
			}
			if errb.Len() == 0 {
				return fmt.Errorf("ssh failed without saying why: %v", err)
			}
			return nil
		}
	}
	runAttacks(t, []attack{
		{side: sideTenant, name: "ssh into another team's sandbox with own key", run: attempt(s.OtherKey, id, id)},
		{side: sideOutsider, name: "ssh into a sandbox with no key", run: attempt("", id, id)},
		{side: sideOutsider, name: "ssh into a sandbox with a made-up key", run: attempt("e2b_00000000000000000000000000000000", id, id)},
		{side: sideTenant, name: "ssh resumes another team's paused sandbox", run: attempt(s.OtherKey, paused, paused)},
		{side: sideTenant, name: "ssh into a sandbox id that does not exist", run: attempt(s.OtherKey, "izzzzzzzzzzzzzzzzzzzz", "")},
	})
}
