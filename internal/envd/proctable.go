package envd

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// retainExited is how long an exited process's end event stays available to
// Connect, so a client that re-attaches right after the exit still sees it.
const retainExited = 30 * time.Second

// chunkSize bounds one data event.
const chunkSize = 32 << 10

// processTable indexes envd's processes by pid.
type processTable struct {
	mu    sync.Mutex
	procs map[uint32]*proc
}

func newProcessTable() *processTable { return &processTable{procs: map[uint32]*proc{}} }

func (t *processTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.procs[p.pid] = p
}

func (t *processTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[p.pid] == p {
		delete(t.procs, p.pid)
	}
}

// get finds a process by selector; exited ones are found while retained.
func (t *processTable) get(sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := t.procs[s.Pid]; ok {
			return p, nil
		}
		return nil, fmt.Errorf("process with pid %d not found: %w", s.Pid, errdefs.ErrNotFound)
	case *process.ProcessSelector_Tag:
		var found *proc
		for _, p := range t.procs {
			// Prefer a running process when a tag was reused.
			if p.tag != nil && *p.tag == s.Tag && (found == nil || found.isDone()) {
				found = p
			}
		}
		if found != nil {
			return found, nil
		}
		return nil, fmt.Errorf("process with tag %q not found: %w", s.Tag, errdefs.ErrNotFound)
	default:
		return nil, fmt.Errorf("process selector is empty: %w", errdefs.ErrInvalidArgument)
	}
}

func (t *processTable) running() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.procs))
	for _, p := range t.procs {
		if !p.isDone() {
			out = append(out, p)
		}
	}
	return out
}

// proc is one started process. Output is fanned out to every subscriber in
// order; with no subscriber it is drained and dropped so the process never
// blocks on a full pipe.
type proc struct {
	pid    uint32
	config *process.ProcessConfig
	tag    *string
	cmd    *exec.Cmd

	stdinMu sync.Mutex
	stdin   *os.File // nil when closed or not requested
	tty     *os.File // pty master, nil without a PTY

	lifetimeCap time.Duration // set when the command lifetime cap ends it

	// The command runs under a reaper (reaper_linux.go); nil control means
	// none (the process is cmd itself).
	reaperPid int          // the reaper, which leads the command's session and group
	spare     *spareReaper // the reusable reaper running the command (spare_linux.go), nil if one of its own
	keepSpare bool         // park spare for the next command once this one's tree is gone
	control   *os.File     // a byte written here kills the command's whole tree
	status    *bufio.Reader
	statusF   *os.File
	killOnce  sync.Once
	capAt     time.Time // when the lifetime cap ends what the command left running; zero: never

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *process.ProcessEvent_EndEvent
	done chan struct{} // closed after end is set
}

// subscriber receives a process's events; events are never dropped, so a
// slow subscriber slows the process's output (back-pressure).
type subscriber struct {
	ch   chan *process.ProcessEvent
	gone chan struct{} // closed when the subscriber leaves
}

func (p *proc) isDone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// subscribe registers for output that arrives from now on. If the process
// has ended, the returned end is non-nil and no subscription is made.
func (p *proc) subscribe() (*subscriber, *process.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil, p.end
	}
	sub := &subscriber{ch: make(chan *process.ProcessEvent, 16), gone: make(chan struct{})}
	p.subs[sub] = struct{}{}
	return sub, nil
}

func (p *proc) unsubscribe(sub *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[sub]; ok {
		delete(p.subs, sub)
		close(sub.gone)
	}
}

// publish delivers ev to every subscriber present now, in the caller's order.
// Callers serialize publish (one at a time) via outMu in the readers.
func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// finish records the end event and wakes subscribers; they read p.end after
// done closes.
func (p *proc) finish(end *process.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	p.mu.Unlock()
	close(p.done)
}

func (p *proc) writeInput(in *process.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Pty:
		if p.tty == nil {
			return fmt.Errorf("process %d has no terminal: %w", p.pid, errdefs.ErrInvalidArgument)
		}
		_, err := p.tty.Write(v.Pty)
		return err
	case *process.ProcessInput_Stdin:
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			if p.tty != nil {
				// SDKs may send stdin to a terminal process; it is the same stream.
				_, err := p.tty.Write(v.Stdin)
				return err
			}
			return fmt.Errorf("stdin of process %d is closed or was not requested: %w", p.pid, errdefs.ErrInvalidArgument)
		}
		_, err := p.stdin.Write(v.Stdin)
		return err
	default:
		return fmt.Errorf("input is empty: %w", errdefs.ErrInvalidArgument)
	}
}

func (p *proc) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.tty != nil {
		return fmt.Errorf("process %d has a terminal; send 0x04 instead: %w", p.pid, errdefs.ErrInvalidArgument)
	}
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) resize(size *process.PTY_Size) error {
	if p.tty == nil {
		return fmt.Errorf("process %d has no terminal: %w", p.pid, errdefs.ErrInvalidArgument)
	}
	if size == nil || size.Cols == 0 || size.Rows == 0 {
		return fmt.Errorf("terminal size must be positive: %w", errdefs.ErrInvalidArgument)
	}
	return pty.Setsize(p.tty, &pty.Winsize{Cols: uint16(size.Cols), Rows: uint16(size.Rows)})
}

// killTree ends everything the command started: its reaper kills the
// whole tree, setsid children and double-forked daemons included.
func (p *proc) killTree() {
	if p.control == nil {
		_ = syscall.Kill(-int(p.pid), syscall.SIGKILL)
		return
	}
	p.killOnce.Do(func() { _, _ = p.control.Write([]byte{'k'}) })
}

// signal sends sig to the command's process group (its reaper leads its
// own session and passes signals on to the command); SIGKILL ends the
// command's whole tree, like its lifetime cap.
func (p *proc) signal(sig syscall.Signal) error {
	if p.isDone() {
		return fmt.Errorf("process %d has exited: %w", p.pid, errdefs.ErrNotFound)
	}
	if sig == syscall.SIGKILL {
		p.killTree()
		return nil
	}
	group := int(p.pid)
	if p.reaperPid != 0 {
		group = p.reaperPid
	}
	if err := syscall.Kill(-group, sig); err != nil {
		if err == syscall.ESRCH {
			return fmt.Errorf("process %d: %w", p.pid, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal process %d: %w", p.pid, err)
	}
	return nil
}
