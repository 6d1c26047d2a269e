package outside

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// TestRuntimeHostFiles attacks the runtime's host files from two sides:
//   - a neighbour: code that escaped sandbox A's mount namespace runs as
//     A's host root uid (its user namespace's range); it tries to read
//     sandbox B's writable layer, rootfs, bundle and memory image;
//   - a host user (nobody): it looks for a live sandbox's id in the
//     world-readable places (mountinfo, cgroupfs, the run and data dirs)
//     and reads a sandbox's files by their host path.
func TestRuntimeHostFiles(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	mk := func(name string) *wire.Sandbox {
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"e2e": "runtime-" + name}})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { _ = c.Kill(context.Background(), sb.SandboxID) })
		return sb
	}
	a, b := mk("a"), mk("b")
	// A gVisor sandbox too: runsc's sandbox and gofer processes live as
	// long as it does, with their command lines readable to every user.
	g, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"e2e": "runtime-g", "agentbox.isolation": "gvisor"}})
	if err != nil {
		t.Fatalf("create gvisor sandbox: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), g.SandboxID) })
	secret := "secret-" + rand.Text()
	// World-readable inside B: only the host's permissions on B's bundle
	// and B's own host ids stand between it and another uid.
	if r, err := c.Run(ctx, b, "root", "mkdir -p /srv && echo "+secret+" > /srv/secret && chmod 644 /srv/secret"); err != nil || r.ExitCode != 0 {
		t.Fatalf("write B's file: %+v %v", r, err)
	}
	stateDir := filepath.Join(s.DataDir, "sandboxes")
	bundle := func(id string) string {
		key, err := bundle.HostKey(stateDir, id)
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(stateDir, key)
	}
	bundleA, bundleB := bundle(a.SandboxID), bundle(b.SandboxID)
	rootA, rootB := mappedRoot(t, bundleA), mappedRoot(t, bundleB)
	if rootA == rootB {
		t.Fatalf("sandboxes A and B share host root uid %d", rootA)
	}
	upperB := filepath.Join(bundleB, "upper", "srv", "secret")
	if _, err := os.Stat(filepath.Join(bundleB, "disk", "upper")); err == nil {
		upperB = filepath.Join(bundleB, "disk", "upper", "srv", "secret")
	}

	// as runs argv as host uid:gid with no groups: nil when the kernel
	// refused, crossed when it worked.
	as := func(uid int, what string, argv ...string) error {
		cmd := exec.CommandContext(ctx, "setpriv", append([]string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(uid), "--clear-groups", "--"}, argv...)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return crossed("%s: %s", what, oneLine(string(out)))
		case errors.As(err, &ee) && refused(string(out)):
			return nil
		default:
			return fmt.Errorf("%s: %v: %s", what, err, out)
		}
	}
	present := func(p string) error {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("target %s missing, the attack would prove nothing: %w", p, err)
		}
		return nil
	}
	fromA := func(name, what string, argv ...string) attack {
		return attack{side: sideNeighbour, name: "sandbox A's host root " + name, run: func(t *testing.T) error {
			if err := present(argv[len(argv)-1]); err != nil {
				return err
			}
			return as(rootA, what, argv...)
		}}
	}
	runAttacks(t, []attack{
		fromA("reads B's writable layer", "read "+upperB, "cat", upperB),
		fromA("reads B's file through B's rootfs", "read B's rootfs", "cat", filepath.Join(bundleB, "rootfs", "srv", "secret")),
		fromA("lists B's bundle", "list B's bundle", "ls", bundleB),
		fromA("reads B's config.json", "read B's config.json", "cat", filepath.Join(bundleB, "config.json")),
		fromA("lists the bundles", "list the bundles", "ls", stateDir),
		{side: sideHostUser, name: "nobody reads a sandbox's writable layer by its host path", run: func(t *testing.T) error {
			if err := present(upperB); err != nil {
				return err
			}
			out, err := harness.AsNobody(ctx, "cat", upperB).CombinedOutput()
			if err == nil {
				return crossed("read %s: %s", upperB, oneLine(string(out)))
			}
			if !refused(string(out)) {
				return fmt.Errorf("cat: %v: %s", err, out)
			}
			return nil
		}},
	})

	// Where a host user could learn a live sandbox's id.
	places := []struct{ name, script string }{
		{"/proc/self/mountinfo", "cat /proc/self/mountinfo"},
		{"cgroupfs", "ls -R /sys/fs/cgroup/*/" + s.Instance + " /sys/fs/cgroup/" + s.Instance + " 2>/dev/null; true"},
		{"the run dir", "ls -R /run/" + s.Instance + " 2>/dev/null; ls /run/" + s.Instance + "/netns /run/" + s.Instance + "/netns.addr /run/" + s.Instance + "/runc 2>/dev/null; true"},
		{"the data dir", "ls -R " + s.DataDir + " 2>/dev/null; ls " + stateDir + " 2>/dev/null; true"},
		{"/run/netns and /proc/*/cmdline", "ls /run/netns 2>/dev/null; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; true"},
	}
	var rows []attack
	for _, p := range places {
		rows = append(rows, attack{side: sideHostUser, name: "nobody finds a live sandbox id in " + p.name, run: func(t *testing.T) error {
			out, err := harness.NobodyShell(ctx, p.script).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", p.script, err, out)
			}
			for _, id := range []string{a.SandboxID, b.SandboxID, g.SandboxID} {
				if i := strings.Index(string(out), id); i >= 0 {
					line := string(out)[max(0, i-80):min(len(out), i+len(id)+20)]
					return crossed("%s shows %s: …%s…", p.name, id, oneLine(line))
				}
			}
			return nil
		}})
	}
	runAttacks(t, rows)

	// B's memory image, once paused: A's host root must not read it.
	st, body, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+b.SandboxID+"/pause", nil)
	if err != nil || st/100 != 2 {
		t.Fatalf("pause B: %d %s %v", st, body, err)
	}
	var img string
	_ = filepath.WalkDir(bundleB, func(p string, d os.DirEntry, err error) error {
		if err == nil && img == "" && strings.HasPrefix(d.Name(), "pages-") && strings.HasSuffix(d.Name(), ".img") {
			img = p
		}
		return nil
	})
	runAttacks(t, []attack{
		{side: sideNeighbour, name: "sandbox A's host root reads B's memory image", run: func(t *testing.T) error {
			if img == "" {
				return fmt.Errorf("no memory image under B's bundle after its pause")
			}
			return as(rootA, "read "+img, "head", "-c", "64", img)
		}},
		{side: sideHostUser, name: "nobody reads a paused sandbox's memory image", run: func(t *testing.T) error {
			if img == "" {
				return fmt.Errorf("no memory image under B's bundle after its pause")
			}
			out, err := harness.AsNobody(ctx, "head", "-c", "64", img).CombinedOutput()
			if err == nil {
				return crossed("read %s", img)
			}
			if !refused(string(out)) {
				return fmt.Errorf("head: %v: %s", err, out)
			}
			return nil
		}},
	})
}

// mappedRoot reads the host uid of root in the bundle's user namespace.
func mappedRoot(t *testing.T, bundle string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatalf("bundle %s: %v", bundle, err)
	}
	var spec struct {
		Linux struct {
			UIDMappings []struct {
				HostID uint32 `json:"hostID"`
			} `json:"uidMappings"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &spec); err != nil || len(spec.Linux.UIDMappings) == 0 {
		t.Fatalf("bundle %s has no user namespace: %v", bundle, err)
	}
	return int(spec.Linux.UIDMappings[0].HostID)
}
