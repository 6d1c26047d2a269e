package interpreter

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recorder is a Sink that keeps what it was given.
type recorder struct {
	stdout, stderr strings.Builder
	errs           []string
}

func (r *recorder) ExecutionCount(int)                      {}
func (r *recorder) Stdout(s string)                         { r.stdout.WriteString(s) }
func (r *recorder) Stderr(s string)                         { r.stderr.WriteString(s) }
func (r *recorder) Result(map[string]json.RawMessage, bool) {}
func (r *recorder) Error(name, value, _ string)             { r.errs = append(r.errs, name+": "+value) }

// An interrupt that reaches the shell after its cell ended (the client gave
// up as the cell finished) must not leak into the next cell.
func TestBashInterruptBetweenCells(t *testing.T) {
	k, err := startBash(t.Context(), bashConfig{Bash: "bash", Cwd: t.TempDir(), RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.Execute(t.Context(), "n=0", false, discard{}); err != nil {
		t.Fatal(err)
	}
	const rounds = 200
	for i := range rounds {
		if err := k.Interrupt(); err != nil {
			t.Fatal(err)
		}
		var r recorder
		if err := k.Execute(t.Context(), "n=$((n+1)); echo $n", false, &r); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if want := strconv.Itoa(i+1) + "\n"; r.stdout.String() != want || len(r.errs) > 0 {
			t.Fatalf("round %d: stdout %q (want %q), errors %v", i, r.stdout.String(), want, r.errs)
		}
	}
	// The client gives up at every moment around a short cell's end; the
	// interrupt that sends lands before, during or after its prompt.
	for i := range rounds {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%40)*50*time.Microsecond)
		err := k.Execute(ctx, "true", false, discard{})
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		var r recorder
		if err := k.Execute(t.Context(), "echo ok", false, &r); err != nil || r.stdout.String() != "ok\n" || len(r.errs) > 0 {
			t.Fatalf("round %d after a cell that was given up on: %v, stdout %q, errors %v", i, err, r.stdout.String(), r.errs)
		}
	}
	// A real interrupt still stops a running builtin loop, the shell and
	// its variables stay.
	ctx, cancel := context.WithCancel(t.Context())
	var loop recorder
	time.AfterFunc(200*time.Millisecond, cancel)
	if err := k.Execute(ctx, "while :; do :; done", false, &loop); err != nil || len(loop.errs) != 1 {
		t.Fatalf("interrupted loop: %v, errors %v", err, loop.errs)
	}
	var r recorder
	if err := k.Execute(t.Context(), "echo $n", false, &r); err != nil || r.stdout.String() != strconv.Itoa(rounds)+"\n" || len(r.errs) > 0 {
		t.Fatalf("after the loop: %v, stdout %q, errors %v", err, r.stdout.String(), r.errs)
	}
}

// Every kernel shrugs off an interrupt that arrives while it is idle: the
// next cell runs and reports its own result.
func TestInterruptWhileIdle(t *testing.T) {
	s, _ := newTestServer(t)
	for _, tc := range []struct {
		language, code, want string
		require              func(*testing.T)
	}{
		{"bash", "echo ok", "ok\n", func(*testing.T) {}},
		{"python", "print('ok')", "ok\n", requirePython},
		{"javascript", "console.log('ok')", "ok\n", requireNode},
		{"r", "cat('ok\\n')", "ok\n", requireR},
		{"java", "System.out.println(\"ok\");", "ok\n", requireJava},
	} {
		t.Run(tc.language, func(t *testing.T) {
			tc.require(t)
			k, err := s.starter(tc.language, t.TempDir())(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			for i := range 20 {
				if err := k.Interrupt(); err != nil {
					t.Fatal(err)
				}
				var r recorder
				if err := k.Execute(t.Context(), tc.code, false, &r); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
				if r.stdout.String() != tc.want || len(r.errs) > 0 {
					t.Fatalf("round %d: stdout %q, errors %v", i, r.stdout.String(), r.errs)
				}
			}
		})
	}
}
