package runc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
	// The test binary is the tests' hook binary: it joins user namespaces
	// as the agentbox binary does.
	"github.com/agentbox/agentbox/internal/runtime/nsjoin"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestMain lets the test binary stand in for `agentbox __hook`, so the
// tests run the same hook code the server's runc and server run.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "__hook" {
		var err error
		switch os.Args[2] {
		case UserNSLimitsHook:
			err = RunUserNSLimitsHook(os.Args[3:], nsjoin.Joined())
		case PlugWaitHook:
			err = RunPlugWaitHook(os.Args[3:])
		case BootIDHook:
			err = RunBootIDHook(os.Args[3:], nsjoin.Joined(), nsjoin.Limited())
		default:
			err = fmt.Errorf("unknown hook %q", os.Args[2])
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testHookBinary is the test binary, by absolute path.
func testHookBinary(tb testing.TB) string {
	tb.Helper()
	p, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestParseUserNSLimits(t *testing.T) {
	want := userNSLimits{pid: 42, instances: 128, watches: 65536}
	got, err := parseUserNSLimits(want.args()[1:])
	if err != nil || got != want {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, want)
	}
	for name, args := range map[string][]string{
		"nothing":       nil,
		"no pid":        {"--inotify-instances", "1", "--inotify-watches", "1"},
		"zero pid":      {"--pid", "0", "--inotify-instances", "1", "--inotify-watches", "1"},
		"negative":      {"--pid", "3", "--inotify-instances", "-1", "--inotify-watches", "1"},
		"not a number":  {"--pid", "1;rm", "--inotify-instances", "1", "--inotify-watches", "1"},
		"unknown flag":  {"--pid", "3", "--inotify-instances", "1", "--inotify-watches", "1", "--max", "2"},
		"extra operand": {"--pid", "3", "--inotify-instances", "1", "--inotify-watches", "1", "x"},
	} {
		if _, err := parseUserNSLimits(args); err == nil {
			t.Errorf("%s: %q accepted", name, args)
		}
	}
}

// The userns-limits hook sets the caps of the target's user namespace
// only: the host's stay as they were.
func TestUserNSLimitsHook(t *testing.T) {
	testutil.RequireRoot(t)
	cmd := exec.Command("sleep", "60")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	hostBefore := readFileT(t, "/proc/sys/user/max_inotify_instances")

	b, err := bundle.New(bundle.Config{StateDir: filepath.Join(t.TempDir(), "s"), EnvdPath: "/bin/true", CgroupParent: "agentbox-test", HookBinary: testHookBinary(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &Driver{b: b, log: slog.Default()}
	if err := r.limitUserNS(context.Background(), "t", cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// Read the namespace's value from inside it, as the hook wrote it.
	out, err := exec.Command("nsenter", "--user", "--target", strconv.Itoa(cmd.Process.Pid), "cat", "/proc/sys/user/max_inotify_instances").CombinedOutput()
	if err != nil {
		t.Fatalf("read the namespace's cap: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(sandboxInotifyInstances) {
		t.Errorf("namespace's max_inotify_instances = %s, want %d", got, sandboxInotifyInstances)
	}
	if got := readFileT(t, "/proc/sys/user/max_inotify_instances"); got != hostBefore {
		t.Errorf("the host's cap changed: %s -> %s", hostBefore, got)
	}

	// Without the join (a hook run in the host's user namespace) the hook
	// refuses instead of setting the host's caps.
	if err := RunUserNSLimitsHook(userNSLimits{pid: cmd.Process.Pid, instances: 1, watches: 1}.args()[1:], false); err == nil {
		t.Fatal("hook outside the target user namespace succeeded")
	}
	if got := readFileT(t, "/proc/sys/user/max_inotify_instances"); got != hostBefore {
		t.Fatalf("the host's cap changed: %s -> %s", hostBefore, got)
	}
}

func readFileT(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The audit session: runc forked in a session carries its login uid, the
// server's own threads do not.
func TestInSession(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/proc/self/loginuid"); err != nil {
		t.Skip("no audit login uids on this kernel")
	}
	before := readFileT(t, "/proc/self/loginuid")
	cmd := exec.Command("cat", "/proc/self/loginuid")
	var out strings.Builder
	cmd.Stdout = &out
	if err := inSession(123456, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "123456" {
		t.Fatalf("child's loginuid %s, want 123456", got)
	}
	if got := readFileT(t, "/proc/self/loginuid"); got != before {
		t.Fatalf("the server's loginuid changed: %s -> %s", before, got)
	}
}

// The CRIU network lock (what `iptables-restore` of CRIU's lock leaves on
// an nftables host) is removed from the netns and only from it.
func TestRemoveCRIULock(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("no iptables to make a lock with")
	}
	name := "abcriu" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := filepath.Join("/run/netns", name)
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, args := range [][]string{{"-N", "CRIU"}, {"-A", "CRIU", "-m", "mark", "--mark", "0xc114", "-j", "ACCEPT"}, {"-A", "CRIU", "-j", "DROP"},
			{"-I", "INPUT", "-j", "CRIU"}, {"-I", "OUTPUT", "-j", "CRIU"}, {"-A", "INPUT", "-j", "ACCEPT"}} {
			if out, err := exec.Command("ip", append([]string{"netns", "exec", name, bin, "-w"}, args...)...).CombinedOutput(); err != nil {
				t.Fatalf("%s %v: %v: %s", bin, args, err, out)
			}
		}
	}
	if err := removeCRIULock(path); err != nil {
		t.Fatal(err)
	}
	c := nftIn(t, path)
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, ch := range chains {
		if ch.Name == criuLockChain {
			t.Errorf("chain %s still in table %s", ch.Name, ch.Table.Name)
		}
		rules, _ := c.GetRules(ch.Table, ch)
		for _, r := range rules {
			if jumpsTo(r, criuLockChain) {
				t.Errorf("a jump to CRIU is left in %s", ch.Name)
			} else if ch.Name == "INPUT" {
				kept++
			}
		}
	}
	if kept != 2 {
		t.Errorf("%d other INPUT rules left, want the 2 (ip, ip6) the lock did not add", kept)
	}
	// Nothing to remove is not an error.
	if err := removeCRIULock(path); err != nil {
		t.Fatalf("second removal: %v", err)
	}
	if err := removeCRIULock(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing netns was accepted")
	}
}

// CRIU's nftables lock (a table "inet CRIU-<pid>") is removed too, and the
// netns's other tables stay.
func TestRemoveCRIUNftLock(t *testing.T) {
	testutil.RequireRoot(t)
	name := "abcriunft" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := filepath.Join("/run/netns", name)
	c := nftIn(t, path)
	for _, tb := range []*nftables.Table{
		{Family: nftables.TableFamilyINet, Name: "CRIU-4242"},
		{Family: nftables.TableFamilyINet, Name: "tenant"},
		{Family: nftables.TableFamilyIPv4, Name: "CRIU-7"}, // not CRIU's: its lock is inet
	} {
		c.AddTable(tb)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := removeCRIULock(path); err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, tb := range tables {
		got[fmt.Sprintf("%d/%s", tb.Family, tb.Name)] = true
	}
	want := map[string]bool{
		fmt.Sprintf("%d/%s", nftables.TableFamilyINet, "tenant"): true,
		fmt.Sprintf("%d/%s", nftables.TableFamilyIPv4, "CRIU-7"): true,
	}
	if len(got) != len(want) {
		t.Errorf("tables left %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Errorf("table %s was removed", k)
		}
	}
}

// nftIn is an nftables connection into the netns at path, open for the
// rest of the test.
func nftIn(t *testing.T, path string) *nftables.Conn {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
