package confine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The test binary is its own Self: `<test> __hook confine <spec>`.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "__hook" && os.Args[2] == confine.Hook {
		if err := confine.RunHook(os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
	}
	os.Exit(m.Run())
}

// toolUID owns nothing on the host.
const toolUID = 0x6ffe0001

func tool(t *testing.T, files []*os.File, stdin string, argv ...string) ([]byte, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var in *strings.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	tl := confine.Tool{Self: self, UID: toolUID, GID: toolUID, Argv: argv, Files: files}
	if in != nil {
		tl.Stdin = in
	}
	return tl.Run(context.Background())
}

// TestEditsImage: debugfs, confined, edits the image it was handed.
func TestEditsImage(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.ext4")
	if out, err := exec.Command("truncate", "-s", "16M", img).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := os.Chown(img, toolUID, toolUID); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seed, err := os.CreateTemp(dir, "seed")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(seed.Name())
	seed.WriteString("hello from the host\n")
	seed.Chown(toolUID, toolUID)
	files := []*os.File{f, seed}
	if out, err := tool(t, files, "write "+confine.FD(1)+" /greeting\n", "/usr/sbin/debugfs", "-w", "-f", "-", confine.FD(0)); err != nil {
		t.Fatalf("debugfs write: %v: %s", err, out)
	}
	out, err := tool(t, files, "", "/usr/sbin/debugfs", "-R", "cat /greeting", confine.FD(0))
	if err != nil || !strings.Contains(string(out), "hello from the host") {
		t.Fatalf("debugfs cat: %v: %s", err, out)
	}
	if out, err := tool(t, files, "", "/usr/sbin/e2fsck", "-f", "-n", confine.FD(0)); err != nil {
		t.Fatalf("e2fsck: %v: %s", err, out)
	}
}

// TestConfined: what a tool that a crafted image took over would try.
func TestConfined(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// World-readable, outside the system dirs: only Landlock keeps it.
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want string // in the output of a refusal
	}{
		{"reads a file it was not handed", []string{"/bin/cat", secret}, "Permission denied"},
		{"writes under /tmp", []string{"/bin/sh", "-c", "echo x > /tmp/confine-test-$$"}, "ermission denied"},
		{"opens a socket", []string{"/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/22"}, "not permitted"},
		{"starts a process", []string{"/bin/sh", "-c", "/bin/true; /bin/true"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tool(t, nil, "", tc.argv...)
			if ee := (*exec.ExitError)(nil); err == nil || !errors.As(err, &ee) {
				t.Fatalf("crossed: %v: %s", err, out)
			}
			t.Logf("%v: %s", err, out)
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("refused for another reason: %v: %s", err, out)
			}
		})
	}
	t.Run("runs as its uid", func(t *testing.T) {
		out, err := tool(t, nil, "", "/usr/bin/id", "-u")
		if err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(toolUID) {
			t.Fatalf("%v: %s", err, out)
		}
	})
	t.Run("runs with limits", func(t *testing.T) {
		out, err := tool(t, nil, "", "/bin/sh", "-c", "ulimit -v; ulimit -n; ulimit -t")
		if err != nil || strings.Fields(string(out))[0] == "unlimited" {
			t.Fatalf("%v: %s", err, out)
		}
	})
}

// TestReadAll: a tree copier reads every file of the tree it was handed,
// whatever its owner and mode, and nothing else; it writes none of it and
// holds no other capability.
func TestReadAll(t *testing.T) {
	testutil.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := os.Mkdir(filepath.Join(tree, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "private", "shadow"), []byte("root-only"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("not handed"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(tree)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	run := func(readAll bool, argv ...string) ([]byte, error) {
		return confine.Tool{Self: self, UID: toolUID, GID: toolUID, Argv: argv, Dirs: []*os.File{d}, ReadAll: readAll}.Run(context.Background())
	}
	for _, tc := range []struct {
		name    string
		readAll bool
		argv    []string
		want    string // in the output; "" for a refusal
	}{
		{"reads a root-only file of the tree", true, []string{"/bin/cat", confine.FD(0) + "/private/shadow"}, "root-only"},
		{"without ReadAll it cannot", false, []string{"/bin/cat", confine.FD(0) + "/private/shadow"}, ""},
		{"reads no file outside the tree", true, []string{"/bin/cat", outside}, ""},
		{"writes nothing in the tree", true, []string{"/bin/sh", "-c", "echo x > " + confine.FD(0) + "/new"}, ""},
		{"holds only CAP_DAC_READ_SEARCH", true, []string{"/bin/grep", "^CapEff", "/proc/self/status"}, "0000000000000004"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.readAll, tc.argv...)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("crossed: %s", out)
				}
				return
			}
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("%v: %s", err, out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(tree, "new")); err == nil {
		t.Fatal("the tool wrote into the tree")
	}
}
