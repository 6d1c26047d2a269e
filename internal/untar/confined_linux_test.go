package untar

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/testutil"
)

// errTestRefusal is the test entry point's refusal.
var errTestRefusal = errors.New("refused by the test unpacker")

// testHook is the test binary's own entry point.
const testHook = "test-unpack"

// testUnpacker keeps the widest set any entry point keeps (a restored
// image's): what the probe shows refused holds for the others too.
func testUnpacker() Unpacker {
	return Unpacker{
		Hook:     testHook,
		Keep:     []uintptr{unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_SETFCAP},
		Defaults: Limits{MaxBytes: 1 << 20, MaxEntries: 7},
		Refusal:  errTestRefusal,
		Clean: func(n string) (string, bool) {
			c := path.Clean(n)
			return c, !strings.HasPrefix(n, "/") && c != ".." && !strings.HasPrefix(c, "../")
		},
	}
}

// testPayload is what the test work reports.
type testPayload struct {
	Limits Limits
	Probe  []string
}

// The test binary runs `__hook test-unpack`: its work reads lines of
// "file NAME", "dir NAME", "opaque NAME", "refuse MSG", "fail MSG" from
// standard input; with confine.ProbeEnv set, it tries to leave instead.
func TestMain(m *testing.M) {
	if len(os.Args) >= 4 && os.Args[1] == "__hook" && os.Args[2] == testHook {
		if err := testUnpacker().Serve(os.Args[3:], testWork); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func testWork(_ context.Context, r io.Reader, root string, lim Limits) ([]string, any, error) {
	p := testPayload{Limits: lim}
	if outside := os.Getenv(confine.ProbeEnv); outside != "" {
		p.Probe = probeEscape(outside)
		return nil, p, nil
	}
	var opaque []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		switch verb {
		case "file":
			if err := os.WriteFile(filepath.Join(root, arg), []byte(arg), 0o644); err != nil {
				return nil, p, err
			}
		case "dir":
			if err := os.Mkdir(filepath.Join(root, arg), 0o755); err != nil {
				return nil, p, err
			}
		case "opaque":
			opaque = append(opaque, arg)
		case "refuse":
			return nil, p, fmt.Errorf("entry %q: %s: %w", arg, "too odd", errTestRefusal)
		case "fail":
			return nil, p, errors.New(arg)
		}
	}
	return opaque, p, sc.Err()
}

// probeEscape is hostile code in the sealed child (a parser bug turned
// into code execution): each attempt is reported as "what: <error>" or
// "what: ok".
func probeEscape(outside string) []string {
	var out []string
	try := func(what string, err error) {
		msg := "ok"
		if err != nil {
			msg = err.Error()
		}
		out = append(out, what+": "+msg)
	}
	try("write outside", func() error {
		if err := os.MkdirAll(outside, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(outside, "pwned"), []byte("x"), 0o644)
	}())
	try("socket inet", socket(unix.AF_INET, unix.SOCK_STREAM))
	try("socket unix", socket(unix.AF_UNIX, unix.SOCK_STREAM))
	try("socket netlink", socket(unix.AF_NETLINK, unix.SOCK_RAW))
	try("chroot", func() error {
		if err := os.Mkdir("/jail", 0o755); err != nil {
			return err
		}
		return unix.Chroot("/jail")
	}())
	try("exec", unix.Exec("/bin/sh", []string{"sh", "-c", "true"}, nil))
	try("host proc", func() error { _, err := os.Stat("/proc/1/root"); return err }())
	try("mknod block", unix.Mknod("/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	try("trusted xattr", unix.Setxattr("/", "trusted.overlay.opaque", []byte("y"), 0))
	try("mount", unix.Mount("none", "/", "tmpfs", 0, ""))
	try("ptrace", func() error { _, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0); return errnoErr(e) }())
	try("file past the size limit", os.WriteFile("/big", make([]byte, 2<<20), 0o644))
	return out
}

func socket(domain, typ int) error {
	fd, err := unix.Socket(domain, typ, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func selfBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return self
}

// TestUnpackerCannotLeave: code running in the unpacker's child writes
// nothing outside its destination, opens no socket, execs nothing, keeps
// no capability beyond owners and modes, and writes no file past the
// limits.
func TestUnpackerCannotLeave(t *testing.T) {
	testutil.RequireRoot(t)
	outside := filepath.Join(t.TempDir(), "outside")
	t.Setenv(confine.ProbeEnv, outside)
	dst := t.TempDir()
	var p testPayload
	if err := testUnpacker().Run(context.Background(), selfBinary(t), strings.NewReader(""), dst, Limits{}, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Probe) != 12 {
		t.Fatalf("probe reported %q", p.Probe)
	}
	for _, r := range p.Probe {
		what, msg, _ := strings.Cut(r, ": ")
		if what == "write outside" {
			// It lands inside the destination, where the child's root is.
			if _, err := os.Stat(filepath.Join(dst, outside, "pwned")); err != nil {
				t.Errorf("the probe's write did not land inside the destination: %v (%s)", err, msg)
			}
			continue
		}
		if msg == "ok" {
			t.Errorf("%s: allowed in the confined unpacker", what)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Error("the confined unpacker wrote outside its destination")
	}
}

// TestUnpackerRun: what the child makes lands in the destination, its
// payload and limits come back, the directories it names are marked
// opaque, and its refusals keep their message and kind.
func TestUnpackerRun(t *testing.T) {
	testutil.RequireRoot(t)
	self := selfBinary(t)
	for _, tc := range []struct {
		name    string
		input   string
		lim     Limits
		refused bool   // errors.Is(err, errTestRefusal)
		outside bool   // errors.Is(err, confine.ErrNamedOutside)
		errText string // the error's whole text; "" for none
		files   []string
		opaque  []string
	}{
		{name: "files and opaque dirs", input: "dir d\nfile d/f\nfile g\nopaque d\n", files: []string{"d/f", "g"}, opaque: []string{"d"}},
		{name: "limits reach the child", input: "", lim: Limits{MaxEntries: 3}},
		{name: "refusal", input: "file a\nrefuse b\n", refused: true, errText: `entry "b": too odd: refused by the test unpacker`},
		{name: "failure", input: "fail disk full\n", errText: "disk full"},
		{name: "opaque outside", input: "opaque ../up\n", outside: true},
		{name: "opaque gone", input: "opaque nothing-here\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := t.TempDir()
			var p testPayload
			err := testUnpacker().Run(context.Background(), self, strings.NewReader(tc.input), dst, tc.lim, &p)
			if got := errors.Is(err, errTestRefusal); got != tc.refused {
				t.Errorf("refusal %v: %v", got, err)
			}
			if got := errors.Is(err, confine.ErrNamedOutside); got != tc.outside {
				t.Errorf("named outside %v: %v", got, err)
			}
			if tc.errText != "" && (err == nil || err.Error() != tc.errText) {
				t.Errorf("error %v, want %q", err, tc.errText)
			}
			if err == nil && (tc.refused || tc.outside || tc.errText != "") {
				t.Fatal("no error")
			}
			if err != nil && !tc.refused && !tc.outside && tc.errText == "" {
				t.Fatal(err)
			}
			if want := tc.lim.Or(testUnpacker().Defaults); p.Limits != want {
				t.Errorf("the child had limits %+v, want %+v", p.Limits, want)
			}
			for _, f := range tc.files {
				if b, err := os.ReadFile(filepath.Join(dst, f)); err != nil || string(b) != filepath.Base(f) && string(b) != f {
					t.Errorf("%s: %q, %v", f, b, err)
				}
			}
			for _, d := range tc.opaque {
				buf := make([]byte, 4)
				n, err := unix.Lgetxattr(filepath.Join(dst, d), "trusted.overlay.opaque", buf)
				if err != nil || string(buf[:n]) != "y" {
					t.Errorf("%s not opaque: %q, %v", d, buf[:max(n, 0)], err)
				}
			}
		})
	}
}

// TestUnpackerNotRecursive: a binary that does not dispatch the hook runs
// its own main in the child, which must never unpack again.
func TestUnpackerNotRecursive(t *testing.T) {
	t.Setenv(childEnv, "1")
	err := testUnpacker().Run(context.Background(), selfBinary(t), strings.NewReader(""), t.TempDir(), Limits{}, nil)
	if err == nil || !strings.Contains(err.Error(), "unpacks again") {
		t.Fatalf("got %v", err)
	}
}
