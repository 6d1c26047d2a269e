package interpreter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"unicode/utf8"
)

// bashKernel is one persistent interactive bash. Each cell is written to a
// file and sourced; bash then prints its prompt, whose PROMPT_COMMAND writes
// a per-shell random marker to the cell's stdout, to its stderr (fd 3) and,
// with the exit status, to bash's own stderr, a private control channel
// (interactive bash also prints job-control noise there). A cell is done
// when all three markers arrived, so none of its output is still in flight.
//
// Interactive mode matters: a non-interactive bash stops reacting to SIGINT
// after an interrupted child (see research/interpreter.md §4).
//
// SIGINT is ignored between cells (PROMPT_COMMAND sets it so): an interrupt
// that reaches an idle shell (its cell ended as the client gave up) would
// otherwise make readline print a prompt of its own, with status 130, which
// the next cell would take for its end. The line that sources a cell traps
// SIGINT with `return 130`, which ends the sourced cell as an interrupt
// should; `trap - INT` would instead leave SIGINT at its default action
// (death of the shell) while the cell runs builtins. A cell's own INT trap
// lasts until the cell ends.
type bashKernel struct {
	p      *proc
	dir    string
	marker []byte // \x1e<nonce>\x1e on stdout and fd 3
	ctlPre []byte // \x1e<nonce>: on the control channel

	stdinMu sync.Mutex
	stdin   io.WriteCloser

	mu      sync.Mutex
	running *bashCell
	seq     int
	count   int
}

type bashEvent struct {
	kind string // "stdout", "stderr", "mark", "rc"
	text string
	rc   int
}

type bashCell struct {
	events chan bashEvent
	done   chan struct{}
}

type bashConfig struct {
	Bash       string
	Cwd        string
	RuntimeDir string
}

func startBash(ctx context.Context, cfg bashConfig) (*bashKernel, error) {
	dir, err := os.MkdirTemp(cfg.RuntimeDir, "sh-")
	if err != nil {
		return nil, fmt.Errorf("bash kernel: %w", err)
	}
	nonce := newID()
	k := &bashKernel{dir: dir, marker: []byte("\x1e" + nonce + "\x1e"), ctlPre: []byte("\x1e" + nonce + ":")}
	var pipes [3][2]*os.File // stdout, fd 3, control
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("bash kernel: %w", err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	cmd := exec.Command(cfg.Bash, "--noprofile", "--norc", "-i")
	cmd.Dir = cfg.Cwd
	cmd.Env = kernelEnv(map[string]string{
		"PS1": "", "PS2": "", "PS0": "",
		"__AB_NONCE":     nonce,
		"PROMPT_COMMAND": `__ab_rc=$?; trap '' INT; printf '\036%s\036' "$__AB_NONCE"; printf '\036%s\036' "$__AB_NONCE" >&3; printf '\036%s:%d\036' "$__AB_NONCE" "$__ab_rc" >&2`,
		"HISTFILE":       "",
		"PAGER":          "cat", "GIT_PAGER": "cat", "TERM": "dumb",
	})
	cmd.Stdout, cmd.Stderr = pipes[0][1], pipes[2][1]
	cmd.ExtraFiles = []*os.File{pipes[1][1]}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("bash kernel: %w", err)
	}
	k.stdin = stdin
	p, err := startProc(cmd)
	for i := range pipes {
		pipes[i][1].Close()
	}
	if err != nil {
		for i := range pipes {
			pipes[i][0].Close()
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bash kernel: %w", err)
	}
	k.p = p
	// The first prompt is a cell of its own: the shell is ready when its
	// markers came through.
	first := k.begin(true)
	go k.readStream(pipes[0][0], "stdout")
	go k.readStream(pipes[1][0], "stderr")
	go k.readControl(pipes[2][0])
	if err := k.wait(ctx, first, discard{}); err != nil {
		k.Close()
		return nil, fmt.Errorf("bash kernel did not start: %w", err)
	}
	if err := k.Execute(ctx, "set +H +o history; unset HISTFILE", true, discard{}); err != nil {
		k.Close()
		return nil, fmt.Errorf("bash kernel: %w", err)
	}
	return k, nil
}

func (k *bashKernel) begin(silent bool) *bashCell {
	c := &bashCell{events: make(chan bashEvent, 64), done: make(chan struct{})}
	k.mu.Lock()
	k.running = c
	if !silent {
		k.count++
	}
	k.mu.Unlock()
	return c
}

func (k *bashKernel) deliver(ev bashEvent) {
	k.mu.Lock()
	c := k.running
	k.mu.Unlock()
	if c == nil {
		return // output of background jobs between cells
	}
	select {
	case c.events <- ev:
	case <-c.done:
	}
}

// readStream forwards a cell stream up to each marker, holding back bytes
// that may be the start of a marker or of a UTF-8 character.
func (k *bashKernel) readStream(r *os.File, kind string) {
	defer r.Close()
	var pending []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, k.marker)
			if i < 0 {
				break
			}
			if i > 0 {
				k.deliver(bashEvent{kind: kind, text: string(pending[:i])})
			}
			k.deliver(bashEvent{kind: "mark"})
			pending = pending[i+len(k.marker):]
		}
		keep := holdBack(pending, k.marker)
		if err != nil {
			keep = 0
		}
		if out := pending[:len(pending)-keep]; len(out) > 0 {
			k.deliver(bashEvent{kind: kind, text: string(out)})
			pending = append([]byte(nil), pending[len(pending)-keep:]...)
		}
		if err != nil {
			return
		}
	}
}

// holdBack is how many trailing bytes of b must wait for more input: a
// proper prefix of marker, or an incomplete UTF-8 sequence.
func holdBack(b, marker []byte) int {
	for n := min(len(b), len(marker)-1); n > 0; n-- {
		if bytes.HasPrefix(marker, b[len(b)-n:]) {
			return n
		}
	}
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < utf8.RuneSelf {
			return 0
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

func (k *bashKernel) readControl(r *os.File) {
	defer r.Close()
	var pending []byte
	buf := make([]byte, 4<<10)
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, k.ctlPre)
			if i < 0 {
				break
			}
			rest := pending[i+len(k.ctlPre):]
			j := bytes.IndexByte(rest, 0x1e)
			if j < 0 {
				break
			}
			rc, _ := strconv.Atoi(string(rest[:j]))
			k.deliver(bashEvent{kind: "rc", rc: rc})
			pending = rest[j+1:]
		}
		// Everything before a possible marker start is shell noise.
		if i := bytes.LastIndexByte(pending, 0x1e); i > 0 {
			pending = append([]byte(nil), pending[i:]...)
		} else if i < 0 {
			pending = pending[:0]
		}
		if err != nil {
			return
		}
	}
}

// wait collects a cell's output until all three markers arrived.
func (k *bashKernel) wait(ctx context.Context, c *bashCell, sink Sink) error {
	defer func() {
		k.mu.Lock()
		if k.running == c {
			k.running = nil
		}
		k.mu.Unlock()
		close(c.done)
	}()
	finished := make(chan struct{})
	result := make(chan error, 1)
	go func() { result <- waitDone(ctx, k, finished) }()
	marks, rc, gotRC := 0, 0, false
	for {
		select {
		case err := <-result:
			return err
		case ev := <-c.events:
			switch ev.kind {
			case "stdout":
				sink.Stdout(ev.text)
			case "stderr":
				sink.Stderr(ev.text)
			case "mark":
				marks++
			case "rc":
				rc, gotRC = ev.rc, true
			}
			if marks >= 2 && gotRC {
				if rc != 0 {
					sink.Error("ExitError", "exit status "+strconv.Itoa(rc), "")
				}
				close(finished)
				return <-result
			}
		}
	}
}

func (k *bashKernel) Execute(ctx context.Context, code string, silent bool, sink Sink) error {
	k.mu.Lock()
	k.seq++
	file := filepath.Join(k.dir, "cell-"+strconv.Itoa(k.seq)+".sh")
	k.mu.Unlock()
	if err := os.WriteFile(file, []byte(code+"\n"), 0o600); err != nil {
		return fmt.Errorf("bash kernel: write cell: %w", err)
	}
	defer os.Remove(file)
	c := k.begin(silent)
	if !silent {
		k.mu.Lock()
		n := k.count
		k.mu.Unlock()
		sink.ExecutionCount(n)
	}
	k.stdinMu.Lock()
	_, err := fmt.Fprintf(k.stdin, "trap 'return 130 2>/dev/null' INT; source %s </dev/null 2>&3\n", shellQuote(file))
	k.stdinMu.Unlock()
	if err != nil {
		k.mu.Lock()
		k.running = nil
		k.mu.Unlock()
		close(c.done)
		return errKernelDied
	}
	return k.wait(ctx, c, sink)
}

// Interrupt sends SIGINT to the shell's process group: the foreground
// program and a running builtin loop stop, the shell and its variables stay.
func (k *bashKernel) Interrupt() error { return k.p.signalGroup(syscall.SIGINT) }

func (k *bashKernel) Exited() <-chan struct{} { return k.p.exited }
func (k *bashKernel) ExitReason() string      { return k.p.reason }
func (k *bashKernel) PID() int                { return k.p.pid() }

func (k *bashKernel) Close() {
	_ = k.stdin.Close()
	k.p.kill()
	_ = os.RemoveAll(k.dir)
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string {
	return "'" + string(bytes.ReplaceAll([]byte(s), []byte("'"), []byte(`'\''`))) + "'"
}
