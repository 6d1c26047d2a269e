// Package graceful stops a loaded server with SIGTERM and checks what its
// clients see, what the sandboxes keep, and that the next server adopts
// them all.
package graceful

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// defaultSandboxes is the CI load (under a minute on two shared cores);
// E2E_GRACEFUL_SANDBOXES sets another count.
const defaultSandboxes = 50

// callDeadline bounds every client call in flight at the SIGTERM, well above
// the server's shutdown grace: a call that reaches it hung.
const callDeadline = 3 * time.Minute

// uploadSize is the size of every upload; in-flight ones send half of it
// and then wait, so they are cut by the shutdown.
const uploadSize = 1 << 20

func sandboxCount(t *testing.T) int {
	v := os.Getenv("E2E_GRACEFUL_SANDBOXES")
	if v == "" {
		return defaultSandboxes
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("E2E_GRACEFUL_SANDBOXES=%q: want a positive number", v)
	}
	return n
}

// box is one sandbox and what was started in it before the SIGTERM.
type box struct {
	sb         *wire.Sandbox
	sleeperPID string
	upload     string // target path of the in-flight upload, or ""
	uploadSum  string // sha256 of the full upload
	uploadErr  error
	uploadOK   bool
	download   bool // a download of /tmp/big was in flight
	streamErr  error
	streamOK   bool
}

// outcome is how a client call ended.
type outcome struct {
	name string
	err  error
}

func TestSIGTERMUnderLoad(t *testing.T) {
	s := harness.Start(t)
	n := sandboxCount(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	before := s.HostState(ctx)
	c := wire.New(s.URL, s.APIKey)

	boxes := make([]*box, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range boxes {
		wg.Go(func() {
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 1800, Metadata: map[string]string{"e2e": "graceful"}})
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			b := &box{sb: sb, upload: "", download: i%5 == 1}
			boxes[i] = b
			cmd := "echo before > /tmp/mark; sleep 3600 >/dev/null 2>&1 & echo $!"
			if b.download {
				cmd = "head -c 33554432 /dev/urandom > /tmp/big; " + cmd
			}
			r, err := c.Run(ctx, sb, "user", cmd)
			if err != nil || r.ExitCode != 0 {
				errs <- fmt.Errorf("prepare %s: %v %+v", sb.SandboxID, err, r)
				return
			}
			b.sleeperPID = strings.TrimSpace(r.Stdout)
			if i%5 == 0 {
				b.upload = "/home/user/upload.bin"
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Start the load: a streaming command in every sandbox, a half-sent
	// upload or a slowly read download in some. Each call reports once it
	// has begun, so the SIGTERM lands while all of them are in flight.
	calls := make(chan outcome, 3*n)
	started := make(chan struct{}, 3*n)
	inFlight := 0
	hold := make(chan struct{}) // closed after the server has exited
	for _, b := range boxes {
		inFlight++
		go func() {
			cctx, ccancel := context.WithTimeout(ctx, callDeadline)
			defer ccancel()
			r, err := c.Run(cctx, b.sb, "user", "touch /tmp/streaming; for i in $(seq 1 100000); do echo tick $i; sleep 0.1; done")
			b.streamErr, b.streamOK = err, err == nil && r != nil
			calls <- outcome{"stream " + b.sb.SandboxID, deadlineHit(cctx, err)}
		}()
		// The stream has begun once its sandbox runs the loop; wait for it.
		go func() {
			for ctx.Err() == nil {
				r, err := c.Run(ctx, b.sb, "user", "test -e /tmp/streaming && echo up")
				if err == nil && strings.TrimSpace(r.Stdout) == "up" {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			started <- struct{}{}
		}()
		if b.upload != "" {
			inFlight++
			data := bytes.Repeat([]byte("agentbox graceful upload\n"), uploadSize/25+1)[:uploadSize]
			sum := sha256.Sum256(data)
			b.uploadSum = hex.EncodeToString(sum[:])
			pr, pw := io.Pipe()
			go func() {
				_, _ = pw.Write(data[:uploadSize/2])
				started <- struct{}{}
				<-hold
				_, _ = pw.Write(data[uploadSize/2:])
				_ = pw.Close()
			}()
			go func() {
				cctx, ccancel := context.WithTimeout(ctx, callDeadline)
				defer ccancel()
				err := c.Upload(cctx, b.sb, b.upload, pr, uploadSize)
				_ = pr.CloseWithError(errors.New("upload call ended"))
				b.uploadErr, b.uploadOK = err, err == nil
				calls <- outcome{"upload " + b.sb.SandboxID, deadlineHit(cctx, err)}
			}()
		}
		if b.download {
			inFlight++
			go func() {
				cctx, ccancel := context.WithTimeout(ctx, callDeadline)
				defer ccancel()
				w := &slowWriter{first: started}
				got, err := c.Download(cctx, b.sb, "/tmp/big", w)
				if !w.told {
					started <- struct{}{}
				}
				if err == nil && got != 32<<20 {
					err = fmt.Errorf("download completed with %d bytes, want %d", got, 32<<20)
					calls <- outcome{"download " + b.sb.SandboxID, err}
					return
				}
				calls <- outcome{"download " + b.sb.SandboxID, deadlineHit(cctx, err)}
			}()
		}
	}
	for range inFlight {
		<-started
	}

	t.Logf("SIGTERM with %d sandboxes and %d calls in flight", n, inFlight)
	s.Terminate(t)
	close(hold)
	var results []string
	for range inFlight {
		o := <-calls
		if errors.Is(o.err, errHung) {
			t.Errorf("%s: %v", o.name, o.err)
		}
		res := "completed"
		if o.err != nil {
			res = o.err.Error()
		}
		results = append(results, o.name+": "+res)
	}
	t.Logf("what the clients saw:\n  %s", strings.Join(results, "\n  "))
	// A command stream still running at the end of the grace ends with the
	// server's end-of-stream message, not a cut connection.
	for _, b := range boxes {
		if b.streamErr == nil || !strings.Contains(b.streamErr.Error(), "unavailable") || !strings.Contains(b.streamErr.Error(), "shutting down") {
			t.Errorf("stream %s: %v; want the end-of-stream error unavailable: the server is shutting down", b.sb.SandboxID, b.streamErr)
		}
	}
	if ps := s.ProcessState(); ps == nil || !ps.Exited() || ps.ExitCode() != 0 {
		t.Errorf("server after SIGTERM: %v, want a clean exit", ps)
	}

	s.Launch(t)
	c = wire.New(s.URL, s.APIKey)
	for _, b := range boxes {
		r, err := c.Run(ctx, b.sb, "user", "cat /tmp/mark; kill -0 "+b.sleeperPID+" && echo alive")
		if err != nil || r.Stdout != "before\nalive\n" {
			t.Errorf("%s after restart: %v %+v; want its file and its background process", b.sb.SandboxID, err, r)
			continue
		}
		if b.upload != "" {
			checkUpload(ctx, t, c, b)
		}
	}
	list, err := c.List(ctx, map[string]string{"e2e": "graceful"})
	if err != nil || len(list) != n {
		t.Errorf("list after restart: %v, %d sandboxes, want %d", err, len(list), n)
	}

	for _, b := range boxes {
		if err := c.Kill(ctx, b.sb.SandboxID); err != nil {
			t.Errorf("kill %s: %v", b.sb.SandboxID, err)
		}
	}
	s.WaitNoLeaks(t, before)
}

// checkUpload checks that an upload cut by the shutdown left no partial
// file under its name: the file is whole (the upload finished) or absent
// (it failed, and the client was told so).
func checkUpload(ctx context.Context, t *testing.T, c *wire.Client, b *box) {
	t.Helper()
	cmd := "if [ -e " + b.upload + " ]; then sha256sum " + b.upload + " | cut -d' ' -f1; else echo absent; fi"
	var got string
	// envd notices the cut connection on its own time: wait for it to settle.
	for range 60 {
		r, err := c.Run(ctx, b.sb, "user", cmd)
		if err != nil {
			t.Errorf("%s: check upload: %v", b.sb.SandboxID, err)
			return
		}
		got = strings.TrimSpace(r.Stdout)
		if got == "absent" || got == b.uploadSum {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	switch {
	case got == b.uploadSum:
	case got == "absent" && !b.uploadOK:
	case got == "absent":
		t.Errorf("%s: upload reported success but %s is absent", b.sb.SandboxID, b.upload)
	default:
		t.Errorf("%s: %s is half-written (sha256 %s) after the upload ended with %v", b.sb.SandboxID, b.upload, got, b.uploadErr)
	}
}

var errHung = errors.New("call hung: it reached its deadline, far past the server's shutdown grace")

// deadlineHit turns an error from a call whose context reached its deadline
// into errHung.
func deadlineHit(ctx context.Context, err error) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w (%v)", errHung, err)
	}
	return err
}

// slowWriter reads a download slowly so it stays in flight; it tells first
// once the first bytes arrived.
type slowWriter struct {
	first chan<- struct{}
	told  bool
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if !w.told {
		w.told = true
		w.first <- struct{}{}
	}
	time.Sleep(5 * time.Millisecond)
	return len(p), nil
}
