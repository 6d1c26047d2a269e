package runc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// The driver's helpers run in Go: in the server (the audit session, the
// CRIU network lock) or as the hidden `agentbox __hook <name>` subcommand
// (bundle.Config.HookBinary) where another process is needed: a runc hook,
// or a process inside a sandbox's user namespace, which a multi-threaded
// Go program cannot enter (internal/runtime/nsjoin does it before the Go
// runtime starts).

// UserNSLimitsHook names the hook that sets a user namespace's limits.
const UserNSLimitsHook = "userns-limits"

// userNSLimits are the arguments of the userns-limits hook.
type userNSLimits struct {
	pid                int // a process in the user namespace
	instances, watches int // max_inotify_instances, max_inotify_watches
}

func (l userNSLimits) args() []string {
	return []string{UserNSLimitsHook, "--pid", strconv.Itoa(l.pid),
		"--inotify-instances", strconv.Itoa(l.instances), "--inotify-watches", strconv.Itoa(l.watches)}
}

// parseUserNSLimits reads the hook's arguments (without its name).
func parseUserNSLimits(args []string) (userNSLimits, error) {
	var l userNSLimits
	fs := flag.NewFlagSet(UserNSLimitsHook, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&l.pid, "pid", 0, "")
	fs.IntVar(&l.instances, "inotify-instances", 0, "")
	fs.IntVar(&l.watches, "inotify-watches", 0, "")
	if err := fs.Parse(args); err != nil {
		return l, fmt.Errorf("%s hook: %w", UserNSLimitsHook, err)
	}
	if fs.NArg() > 0 {
		return l, fmt.Errorf("%s hook: unexpected argument %q", UserNSLimitsHook, fs.Arg(0))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"pid", l.pid}, {"inotify-instances", l.instances}, {"inotify-watches", l.watches}} {
		if f.v <= 0 {
			return l, fmt.Errorf("%s hook: --%s: want a positive number, got %d", UserNSLimitsHook, f.name, f.v)
		}
	}
	return l, nil
}

// RunUserNSLimitsHook is the Go side of `agentbox __hook userns-limits`,
// whose work (joining --pid's user namespace and setting its inotify caps,
// which /proc/sys/user shows to a process inside it only) is done by
// internal/runtime/nsjoin's constructor before the Go runtime starts. It is
// reached only when the constructor left the call alone, and names why.
func RunUserNSLimitsHook(args []string, joined bool) error {
	l, err := parseUserNSLimits(args)
	if err != nil {
		return err
	}
	if !joined {
		return fmt.Errorf("%s hook: not in the user namespace of pid %d (the binary lacks internal/runtime/nsjoin, or was built without cgo): %w", UserNSLimitsHook, l.pid, errdefs.ErrUnavailable)
	}
	return notRun(UserNSLimitsHook, args)
}

// notRun is the error of a hook whose well-formed call reached Go: its
// work is nsjoin's constructor's, which acts only on the exact command
// line the server makes.
func notRun(hook string, args []string) error {
	return fmt.Errorf("%s hook: %q: pass the flags exactly as the server does (--flag value, in its order); internal/runtime/nsjoin acts on nothing else: %w", hook, args, errdefs.ErrInvalidArgument)
}

// Each sandbox's user namespace gets normal per-user Linux inotify caps;
// the host's per-user caps are raised far above them (bundle/userns.go).
const (
	sandboxInotifyInstances = 128
	sandboxInotifyWatches   = 65536
)

// limitUserNS sets the inotify caps of sandbox id's user namespace, whose
// init is pid (0: ask the runtime). It refuses to touch a sandbox that
// shares the host's user namespace (one started without -userns), whose
// /proc/sys/user is the host's.
func (d *Driver) limitUserNS(ctx context.Context, id string, pid int) error {
	if pid <= 0 {
		var err error
		if pid, err = d.initPid(ctx, id); err != nil {
			return err
		}
	}
	self, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return err
	}
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		return err
	}
	if self == theirs {
		return nil
	}
	if d.b.HookBinary() == "" {
		return fmt.Errorf("set inotify caps of %s's user namespace: no hook binary configured: %w", id, errdefs.ErrUnavailable)
	}
	argv := d.b.HookArgv(userNSLimits{pid: pid, instances: sandboxInotifyInstances, watches: sandboxInotifyWatches}.args()...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("set inotify caps of %s's user namespace: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inSession runs start, which starts a runc process (and may wait for it), in
// a new audit session whose login uid is loginuid: the login uid is written
// for the calling thread only, the child inherits it from the thread that
// forks it, and the thread is thrown away afterwards (it stays locked when
// its goroutine ends), so no other work of the server runs under that
// session. Where the kernel refuses (no audit, an immutable login uid), the
// process starts as before.
func inSession(loginuid uint32, start func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if unix.Gettid() == unix.Getpid() {
			// The runtime never ends the main thread, so a login uid set
			// there would stay on the server's own thread (and show in
			// /proc/<pid>/loginuid). Holding the main thread here, run on
			// another; this thread keeps its own uid and can be released.
			errc <- inSession(loginuid, start)
			goruntime.UnlockOSThread()
			return
		}
		_ = os.WriteFile("/proc/thread-self/loginuid", []byte(strconv.FormatUint(uint64(loginuid), 10)), 0o644)
		errc <- start()
	}()
	return <-errc
}

// criuUnlock removes the network lock a CRIU dump leaves in the netns (an
// iptables CRIU chain dropping everything, or with the nftables method a
// table "inet CRIU-<pid>"; lifted by CRIU's own restore):
// a fresh boot after a memory pause would otherwise be unreachable. The
// host's iptables is the nftables backend, so the lock is an nftables
// chain "CRIU" in the ip and ip6 "filter" tables, with jumps to it from
// INPUT and OUTPUT; it is removed with nftables netlink inside the netns.
func criuUnlock(dir string) error {
	path, err := bundle.NetNSPath(dir)
	if errors.Is(err, bundle.ErrNoNetNS) {
		return nil
	}
	if err != nil {
		return err
	}
	return removeCRIULock(path)
}

// inSession runs start in a new audit session of the sandbox (see
// bundle.RecordSession), with the pool's first host id as login uid.
func (d *Driver) inSession(start func() error) error {
	return inSession(d.b.UserNSBase(), start)
}

// criuLockChain is the chain of CRIU's iptables network lock.
const criuLockChain = "CRIU"

// removeCRIULock removes CRIU's network lock from the netns at path.
func removeCRIULock(path string) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("remove CRIU network lock: netns %s: %w", path, err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return fmt.Errorf("remove CRIU network lock: %w", err)
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		return fmt.Errorf("remove CRIU network lock: list chains: %w", err)
	}
	found := false
	// CRIU's nftables lock is a table of its own, "inet CRIU-<pid>".
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("remove CRIU network lock: list tables: %w", err)
	}
	for _, t := range tables {
		if strings.HasPrefix(t.Name, criuLockChain+"-") {
			c.DelTable(t)
			found = true
		}
	}
	for _, lock := range chains {
		if lock.Name != criuLockChain || lock.Table.Name != "filter" {
			continue
		}
		found = true
		for _, ch := range chains {
			if ch.Table.Name != lock.Table.Name || ch.Table.Family != lock.Table.Family || ch == lock {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return fmt.Errorf("remove CRIU network lock: rules of %s: %w", ch.Name, err)
			}
			for _, rule := range rules {
				if jumpsTo(rule, criuLockChain) {
					if err := c.DelRule(rule); err != nil {
						return fmt.Errorf("remove CRIU network lock: %w", err)
					}
				}
			}
		}
		c.FlushChain(lock)
		c.DelChain(lock)
	}
	if !found {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove CRIU network lock: %w", err)
	}
	return nil
}

// jumpsTo reports whether rule jumps to (or goes to) chain.
func jumpsTo(rule *nftables.Rule, chain string) bool {
	for _, e := range rule.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && v.Chain == chain {
			return true
		}
	}
	return false
}

// initPid returns the host pid of sandbox id's init.
func (d *Driver) initPid(ctx context.Context, id string) (int, error) {
	c, err := d.client("").State(ctx, d.CID(id))
	if err != nil {
		return 0, fmt.Errorf("runc state %s: %w", id, err)
	}
	if c.Pid <= 0 {
		return 0, fmt.Errorf("runc state %s: no init pid: %w", id, errdefs.ErrUnavailable)
	}
	return c.Pid, nil
}
