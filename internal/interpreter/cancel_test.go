package interpreter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// markerPIDs lists the processes whose command line is "sleep <marker>".
func markerPIDs(marker string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && string(b) == "sleep\x00"+marker+"\x00" {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

// waitFor polls cond until it holds or the test's patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond) // a poll interval, not an assertion
	}
}

// TestDisconnectInterruptsEveryLanguage: a client that goes away while its
// cell loops (here: a pooled keep-alive client cancelling its request)
// interrupts the cell on every language. The context keeps its state, the
// next cell runs, and the program the looping cell started is gone.
func TestDisconnectInterruptsEveryLanguage(t *testing.T) {
	tests := []struct {
		language string
		require  func(*testing.T)
		set      string // code keeping state
		get      string // code showing it
		want     string // in get's result or stdout
		loop     string // code starting "sleep %s" and looping
		// childStays: the started program outlives the interrupt. R 4.2's
		// system() hands an interrupt to the command and carries on (so a
		// loop of system() calls cannot be interrupted, on E2B's IRkernel
		// too); a command it starts in the background ignores SIGINT, as
		// POSIX shells start them.
		childStays bool
	}{
		{"python", requirePython, "kept = 7", "kept", "7",
			"import subprocess, time\nsubprocess.Popen(['sleep', '%s'])\nwhile True: time.sleep(0.05)", false},
		{"javascript", requireNode, "var kept = 7", "kept", "7",
			"require('node:child_process').spawn('sleep', ['%s']); while (true) {}", false},
		{"typescript", requireNode, "let kept: number = 7", "kept", "7",
			"require('node:child_process').spawn('sleep', ['%s']); while (true) {}", false},
		{"r", requireR, "kept <- 7", "kept", "[1] 7",
			"system('sleep %s', wait = FALSE); repeat { Sys.sleep(0.05) }", true},
		// system() ignores SIGINT while its command runs: the kernel
		// interrupts itself once the interrupted command returns.
		{"r", requireR, "kept <- 7", "kept", "[1] 7",
			"repeat { system('sleep %s') }", false},
		{"r", requireR, "kept <- 7", "kept", "[1] 7",
			"repeat { system2('sleep', '%s') }", false},
		{"java", requireJava, "int kept = 7;", "kept", "7",
			"new ProcessBuilder(\"sleep\", \"%s\").start(); while (true) { Thread.sleep(50); }", false},
		{"bash", func(*testing.T) {}, "KEPT=7", "echo $KEPT", "7",
			"while true; do sleep %s; done", false},
	}
	// Rows of one language share a server, and so a kernel, as an SDK
	// user's context does: one interrupt must not spoil the next.
	servers := map[string]*httptest.Server{}
	parent := t
	for i, tt := range tests {
		t.Run(tt.language, func(t *testing.T) {
			tt.require(t)
			hs := servers[tt.language]
			if hs == nil {
				_, hs = newTestServer(parent)
				servers[tt.language] = hs
			}
			in := func(ctx context.Context, code string) *execution {
				return runCtx(ctx, t, hs, map[string]any{"code": code, "language": tt.language})
			}
			if e := in(t.Context(), tt.set); len(e.Errors) > 0 {
				t.Fatalf("set: %v", e.Errors)
			}
			marker := fmt.Sprint(31000 + os.Getpid()%1000*10 + i)
			t.Cleanup(func() {
				for _, pid := range markerPIDs(marker) {
					if n, err := strconv.Atoi(pid); err == nil {
						_ = syscall.Kill(n, syscall.SIGKILL)
					}
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			b, _ := json.Marshal(map[string]any{"code": fmt.Sprintf(tt.loop, marker), "language": tt.language})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/execute", bytes.NewReader(b))
			done := make(chan struct{})
			var looped bytes.Buffer // what the client saw, for failure messages
			go func() {
				defer close(done)
				if resp, err := hs.Client().Do(req); err == nil {
					_, _ = io.Copy(&looped, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the looping cell to start sleep "+marker, func() bool { return len(markerPIDs(marker)) > 0 })
			cancel() // the client goes away
			<-done
			e := in(t.Context(), tt.get)
			got := e.mainText() + e.lastText() + e.stdout()
			if !strings.Contains(got, tt.want) || len(e.Errors) > 0 {
				t.Fatalf("after the disconnect: got %q errors %v, want %q (state kept); the looping cell sent %s", got, e.Errors, tt.want, looped.String())
			}
			if !tt.childStays {
				waitFor(t, "sleep "+marker+" to be gone", func() bool { return len(markerPIDs(marker)) == 0 })
			}
		})
	}
}

// TestIgnoredInterruptRestartsForTheNext: code that ignores the interrupt
// gets its kernel restarted; a cell queued behind it runs on the new kernel
// instead of finding the context dead.
func TestIgnoredInterruptRestartsForTheNext(t *testing.T) {
	requirePython(t)
	_, hs := newTestServer(t)
	in := func(ctx context.Context, code string) *execution {
		return runCtx(ctx, t, hs, map[string]any{"code": code, "language": "python"})
	}
	in(t.Context(), "1")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ignoring', flush=True)\nwhile True: pass", "language": "python"})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/execute", bytes.NewReader(b))
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	e := readUntil(t, resp.Body, "ignoring")
	cancel() // the client goes away; the code ignores the interrupt
	resp.Body.Close()
	if e = in(t.Context(), "2 + 2"); e.mainText() != "4" {
		t.Fatalf("the next cell: %q errors %v", e.mainText(), e.Errors)
	}
}

// readUntil reads an execution's stream until a stdout chunk holds text.
func readUntil(t *testing.T, r io.Reader, text string) *execution {
	t.Helper()
	dec := json.NewDecoder(r)
	e := &execution{}
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("stream ended before %q: %v", text, err)
		}
		if m["type"] == "stdout" {
			e.Stdout = append(e.Stdout, m["text"].(string))
			if strings.Contains(m["text"].(string), text) {
				return e
			}
		}
	}
}
