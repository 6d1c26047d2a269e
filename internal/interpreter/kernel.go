package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sink receives one execution's output, in order, from one goroutine.
type Sink interface {
	ExecutionCount(n int)
	Stdout(text string)
	Stderr(text string)
	// Result is a MIME bundle; main marks the cell's value (as opposed to
	// something displayed while it ran).
	Result(bundle map[string]json.RawMessage, main bool)
	Error(name, value, traceback string)
}

// discard is the sink of silent executions (env var set-up and clean-up).
type discard struct{}

func (discard) ExecutionCount(int)                      {}
func (discard) Stdout(string)                           {}
func (discard) Stderr(string)                           {}
func (discard) Result(map[string]json.RawMessage, bool) {}
func (discard) Error(string, string, string)            {}

// kernel is one running language process holding a context's state.
type kernel interface {
	// Execute runs code and streams its output to sink. It returns when the
	// code finished (errors raised by the code go to the sink, not here),
	// errKernelDied when the process ended meanwhile, or
	// errInterruptIgnored when ctx ended and the code did not stop within
	// interruptGrace of being interrupted. silent executions leave no trace
	// in the execution count.
	Execute(ctx context.Context, code string, silent bool, sink Sink) error
	// Interrupt asks the running code to stop, like Ctrl-C.
	Interrupt() error
	// Exited is closed when the kernel process has ended.
	Exited() <-chan struct{}
	// ExitReason says how it ended ("exit status 1", "signal: killed").
	ExitReason() string
	// Close kills the process (and its process group) and frees resources.
	Close()
	// PID is the kernel process id.
	PID() int
}

var (
	errKernelDied       = errors.New("kernel process exited")
	errInterruptIgnored = errors.New("code did not stop after an interrupt")
)

// interruptGrace is how long interrupted code may take to stop before its
// kernel is considered stuck (it is then restarted).
const interruptGrace = 3 * time.Second

// waitDone waits for an execution to finish, interrupting it once ctx ends.
func waitDone(ctx context.Context, k kernel, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-k.Exited():
		return errKernelDied
	case <-ctx.Done():
	}
	select {
	case <-done:
		return nil // it finished meanwhile: nothing to interrupt
	default:
	}
	_ = k.Interrupt()
	t := time.NewTimer(interruptGrace)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-k.Exited():
		return errKernelDied
	case <-t.C:
		return errInterruptIgnored
	}
}

// proc is a kernel's OS process: started in its own process group so
// interrupts and kills reach the programs the user code started too.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	reason string // valid once exited is closed
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	// No Pdeathsig: it fires when the OS thread that forked exits, which
	// Go does not promise never to happen; Server.Close kills kernels.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		switch ee, ok := errors.AsType[*exec.ExitError](err); {
		case err == nil:
			p.reason = "exit status 0"
		case ok:
			if ws, isWS := ee.Sys().(syscall.WaitStatus); isWS && ws.Signaled() {
				p.reason = "killed by signal " + ws.Signal().String()
			} else {
				p.reason = "exit status " + strconv.Itoa(ee.ExitCode())
			}
		default:
			p.reason = err.Error()
		}
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) signalGroup(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// kill ends the whole process group and waits for the kernel to be reaped.
func (p *proc) kill() {
	_ = p.signalGroup(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// kernelEnv is the environment of kernel processes: the server's own
// (which carries the sandbox's env vars) plus extra, which wins.
func kernelEnv(extra map[string]string) []string {
	env := os.Environ()
	out := make([]string, 0, len(env)+len(extra))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range extra {
		out = append(out, k+"="+v)
	}
	return out
}

// envMap maps NAME=value entries (os.Environ, an exec.Cmd's Env) by name.
func envMap(kvs []string) map[string]string {
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}
