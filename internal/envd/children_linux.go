package envd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Children is envd's record of its own child processes and, when envd is
// the sandbox's init, the reaper of every other process that ends as its
// child: orphans the kernel re-parents to PID 1 (or to a subreaper).
//
// A Go program that reaps with wait4(-1) steals the exit statuses its own
// exec.Cmd.Wait calls need. So ReapOrphans only peeks at the first exited
// child (waitid P_ALL with WNOWAIT, which leaves it a zombie) and reaps it
// only if it is not one of ours:
//   - a child is ours from its fork: Start counts the start as under way
//     before it forks, and while any start is under way the reaper reaps
//     nothing (the new pid is not known until the fork returns); the pid
//     is registered before the count drops;
//   - it stays ours until Wait has reaped it, so its status cannot be
//     taken from under exec.Cmd.Wait;
//   - an exited child of ours hides the children the kernel lists after
//     it from the peek until its Wait reaps it; Wait and the end of a
//     start wake the reaper, which then looks again.
//
// Every child the server starts must go through Start and Wait.
type Children struct {
	mu       sync.Mutex
	starting int         // starts under way
	own      map[int]int // pid → registrations (a pid may be reused before the Wait of its first holder forgets it)
	wake     chan struct{}
}

// NewChildren returns an empty record; nothing is reaped until ReapOrphans runs.
func NewChildren() *Children {
	return &Children{own: map[int]int{}, wake: make(chan struct{}, 1)}
}

// Start registers cmd's process as ours and forks it with start (cmd.Start
// or a wrapper of it such as pty.StartWithAttrs). A started process must
// be waited for with Wait.
func (c *Children) Start(cmd *exec.Cmd, start func() error) error {
	c.mu.Lock()
	c.starting++
	c.mu.Unlock()
	var err error
	defer func() { // also if start panics: the reaper must not wait forever
		c.mu.Lock()
		c.starting--
		if err == nil && cmd.Process != nil {
			c.own[cmd.Process.Pid]++
		}
		c.mu.Unlock()
		c.poke()
	}()
	err = start()
	return err
}

// Wait is cmd.Wait for a process started with Start.
func (c *Children) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	if cmd.Process != nil {
		c.mu.Lock()
		if c.own[cmd.Process.Pid]--; c.own[cmd.Process.Pid] <= 0 {
			delete(c.own, cmd.Process.Pid)
		}
		c.mu.Unlock()
		c.poke()
	}
	return err
}

func (c *Children) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// orphanRetry is how soon the reaper looks again while an exited child of
// ours hides the rest and no Wait has woken it: a safety net only.
const orphanRetry = time.Second

// ReapOrphans reaps, until ctx ends, every exited child that is not ours.
// envd runs it as the sandbox's PID 1; a process that is not an init (or
// a child subreaper) has no orphans to reap.
func (c *Children) ReapOrphans(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	retry := time.NewTimer(orphanRetry)
	defer retry.Stop()
	for {
		if c.reap() {
			retry.Reset(orphanRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-c.wake:
		case <-retry.C:
		}
	}
}

// reap reaps exited children that are not ours, and reports whether it
// stopped at one of ours (or at a start under way) that hides the rest.
func (c *Children) reap() (hidden bool) {
	for {
		pid, err := peekExited()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid == 0 { // ECHILD: no children; 0: none exited
			return false
		}
		c.mu.Lock()
		if c.starting > 0 || c.own[pid] > 0 {
			c.mu.Unlock()
			return true
		}
		// Under the lock: no start is under way, so pid cannot become ours.
		var ws unix.WaitStatus
		_, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		c.mu.Unlock()
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
	}
}

// siginfo is the part of the kernel's siginfo_t that waitid fills in for
// an exited child (x86_64 and arm64 layout).
type siginfo struct {
	signo, errno, code int32
	_                  int32
	pid                int32
	uid                uint32
	status             int32
	_                  [100]byte
}

// peekExited returns the pid of an exited child without reaping it, or 0
// when none has exited.
func peekExited() (int, error) {
	var info siginfo
	_, _, errno := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)),
		unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(info.pid), nil
}
