package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// nodeKernel runs assets/node_kernel.js: JSON requests on stdin, JSON
// events on fd 3. The process's own stdout/stderr carry what child
// processes write directly; it is attributed to the running cell. The Java
// kernel (assets/JavaKernel.java) speaks the same protocol.
type nodeKernel struct {
	p *proc
	// prepare turns a cell into what the kernel runs; an error is the
	// cell's SyntaxError. nil: the cell as is.
	prepare func(code string) (string, error)
	// sigint: an interrupt may also send SIGINT (Node). A JVM dies of it.
	sigint bool
	name   string

	stdinMu sync.Mutex
	stdin   io.WriteCloser

	mu      sync.Mutex
	nextID  int
	count   int
	running *nodeCell
}

type nodeCell struct {
	id     int
	events chan nodeEvent
	done   chan struct{}
}

type nodeEvent struct {
	ID     int                        `json:"id"`
	Type   string                     `json:"type"`
	Text   string                     `json:"text"`
	Main   bool                       `json:"main"`
	Data   map[string]json.RawMessage `json:"data"`
	Ename  string                     `json:"ename"`
	Evalue string                     `json:"evalue"`
	Trace  string                     `json:"traceback"`
}

type nodeConfig struct {
	Node       string // node binary
	Script     string // node_kernel.js
	Cwd        string
	TypeScript bool
	Log        io.Writer
}

func startNode(ctx context.Context, cfg nodeConfig) (*nodeKernel, error) {
	cmd := exec.Command(cfg.Node, "--no-warnings", "--stack-trace-limit=20", cfg.Script)
	cmd.Dir = cfg.Cwd
	cmd.Env = kernelEnv(map[string]string{"NODE_NO_READLINE": "1"})
	k := &nodeKernel{name: "node kernel", sigint: true, prepare: func(code string) (string, error) {
		return prepareJS(code, cfg.TypeScript)
	}}
	return startEventKernel(ctx, k, cmd, cfg.Log)
}

// startEventKernel starts k's process, cmd, with the protocol's pipes and
// waits for its ready event.
func startEventKernel(ctx context.Context, k *nodeKernel, cmd *exec.Cmd, log io.Writer) (*nodeKernel, error) {
	evR, evW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.name, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("%s: %w", k.name, err)
	}
	cmd.Stdout, cmd.Stderr = outW, outW
	cmd.ExtraFiles = []*os.File{evW} // fd 3
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.name, err)
	}
	p, err := startProc(cmd)
	evW.Close()
	outW.Close()
	if err != nil {
		evR.Close()
		outR.Close()
		return nil, fmt.Errorf("%s: %w", k.name, err)
	}
	k.p, k.stdin = p, stdin
	ready := make(chan struct{})
	go k.readEvents(evR, ready)
	go k.readRaw(outR, log)
	select {
	case <-ready:
		return k, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited at start (%s); see the interpreter log", k.name, p.reason)
	case <-ctx.Done():
		k.Close()
		return nil, fmt.Errorf("%s did not start: %w", k.name, ctx.Err())
	}
}

func (k *nodeKernel) readEvents(r *os.File, ready chan struct{}) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			var ev nodeEvent
			if json.Unmarshal(line, &ev) == nil {
				if ev.Type == "ready" {
					close(ready)
					continue
				}
				k.mu.Lock()
				c := k.running
				k.mu.Unlock()
				if c != nil && c.id == ev.ID {
					select {
					case c.events <- ev: // backpressure on a slow client
					case <-c.done:
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// readRaw forwards what bypassed the kernel's patched streams (child
// processes with inherited stdio, crashes) to the running cell's stdout,
// or to the log between cells.
func (k *nodeKernel) readRaw(r *os.File, log io.Writer) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			k.mu.Lock()
			c := k.running
			k.mu.Unlock()
			text := string(bytes.Clone(buf[:n]))
			delivered := false
			if c != nil {
				select {
				case c.events <- nodeEvent{ID: c.id, Type: "stdout", Text: text}:
					delivered = true
				case <-c.done:
				}
			}
			if !delivered && log != nil {
				_, _ = log.Write(buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

func (k *nodeKernel) Execute(ctx context.Context, code string, silent bool, sink Sink) error {
	prepared, err := code, error(nil)
	if k.prepare != nil {
		prepared, err = k.prepare(code)
	}
	if err != nil {
		if !silent {
			k.mu.Lock()
			k.count++
			n := k.count
			k.mu.Unlock()
			sink.ExecutionCount(n)
		}
		sink.Error("SyntaxError", err.Error(), "SyntaxError: "+err.Error())
		return nil
	}
	k.mu.Lock()
	k.nextID++
	c := &nodeCell{id: k.nextID, events: make(chan nodeEvent, 64), done: make(chan struct{})}
	k.running = c
	if !silent {
		k.count++
	}
	n := k.count
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		if k.running == c {
			k.running = nil
		}
		k.mu.Unlock()
		close(c.done)
	}()
	if !silent {
		sink.ExecutionCount(n)
	}
	if err := k.send(map[string]any{"id": c.id, "code": prepared}); err != nil {
		return err
	}
	finished := make(chan struct{})
	result := make(chan error, 1)
	go func() { result <- waitDone(ctx, k, finished) }()
	for {
		select {
		case err := <-result:
			return err
		case ev := <-c.events:
			switch ev.Type {
			case "stdout":
				sink.Stdout(ev.Text)
			case "stderr":
				sink.Stderr(ev.Text)
			case "result":
				sink.Result(ev.Data, ev.Main)
			case "error":
				sink.Error(ev.Ename, ev.Evalue, ev.Trace)
			case "done":
				close(finished)
				return <-result
			}
		}
	}
}

func (k *nodeKernel) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	k.stdinMu.Lock()
	defer k.stdinMu.Unlock()
	if _, err := k.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w", k.name, errKernelDied)
	}
	return nil
}

// Interrupt first asks the kernel to abandon a cell that waits on a
// promise; code that holds the CPU cannot read that request, so if the cell
// still runs shortly after, SIGINT breaks it (node:repl's breakEvalOnSigint).
func (k *nodeKernel) Interrupt() error {
	k.mu.Lock()
	c := k.running
	k.mu.Unlock()
	if c == nil {
		return nil
	}
	if err := k.send(map[string]any{"interrupt": c.id}); err != nil {
		return err
	}
	if !k.sigint {
		k.p.signalOthers(syscall.SIGINT)
		return nil
	}
	go func() {
		select {
		case <-c.done:
		case <-k.p.exited:
		case <-time.After(150 * time.Millisecond):
			_ = k.p.signalGroup(syscall.SIGINT)
		}
	}()
	return nil
}

func (k *nodeKernel) Exited() <-chan struct{} { return k.p.exited }
func (k *nodeKernel) ExitReason() string      { return k.p.reason }
func (k *nodeKernel) PID() int                { return k.p.pid() }

func (k *nodeKernel) Close() {
	_ = k.stdin.Close()
	k.p.kill()
}
