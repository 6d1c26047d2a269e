package outside

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestHostUserAttacks: an unprivileged user of the server host (nobody,
// no groups) tries to read the server's state: the database holds every
// team's key hashes and sandbox tokens, the apikey file a working key.
func TestHostUserAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// asNobody runs argv as nobody: nil when refused with EACCES/EPERM,
	// crossed when it succeeded, an error when it failed otherwise.
	asNobody := func(what string, argv ...string) error {
		out, err := harness.AsNobody(ctx, argv[0], argv[1:]...).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return crossed("%s: %s", what, firstLine(string(out)))
		case errors.As(err, &ee) && refused(string(out)):
			return nil
		default:
			return fmt.Errorf("%s: %v: %s", what, err, out)
		}
	}
	// exists makes sure a refusal means something: the target is there.
	exists := func(p string) error {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("target missing, the attack would prove nothing: %w", err)
		}
		return nil
	}
	file := func(name string) attack {
		p := filepath.Join(s.DataDir, name)
		return attack{side: sideHostUser, name: "nobody reads <data-dir>/" + name, run: func(t *testing.T) error {
			if err := exists(p); err != nil {
				return err
			}
			return asNobody("read "+p, "head", "-c", "64", p)
		}}
	}
	runAttacks(t, []attack{
		{side: sideHostUser, name: "nobody lists the data dir", run: func(t *testing.T) error {
			if err := exists(s.DataDir); err != nil {
				return err
			}
			return asNobody("list "+s.DataDir, "ls", "-A", s.DataDir)
		}},
		file("apikey"),
		file("agentbox.db"),
		{side: sideHostUser, name: "nobody runs `agentbox apikey create` on the data dir", run: func(t *testing.T) error {
			return asNobody("mint a key", s.Bin, "apikey", "create", "--data-dir", s.DataDir, "--team", "nobody")
		}},
	})
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// refused reports whether a command's output says the kernel refused it.
func refused(out string) bool {
	out = strings.ToLower(out)
	return strings.Contains(out, "permission denied") || strings.Contains(out, "operation not permitted") ||
		strings.Contains(out, "readonly database") // SQLite opened the file but may not write it
}
