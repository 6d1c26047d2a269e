package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// subreaperChildEnv makes the test binary run TestChildren's body as a
// child subreaper: orphans of its commands' shells fall to it as they fall
// to envd as PID 1, without root or a PID namespace.
const subreaperChildEnv = "ENVD_CHILDREN_SUBREAPER"

func TestChildren(t *testing.T) {
	if os.Getenv(subreaperChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildren$", "-test.v")
		cmd.Env = append(os.Environ(), subreaperChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestChildren") {
			t.Fatalf("subreaper child: %v\n%s", err, out)
		}
		return
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	c := NewChildren()
	// run starts script through c and returns its exit code.
	run := func(script string) (int, error) {
		cmd := exec.Command("/bin/sh", "-c", script)
		if err := c.Start(cmd, cmd.Start); err != nil {
			return 0, err
		}
		err := c.Wait(cmd)
		if _, ok := errors.AsType[*exec.ExitError](err); err != nil && !ok {
			return 0, fmt.Errorf("wait %q: %w", script, err) // the status was taken from us
		}
		return cmd.ProcessState.ExitCode(), nil
	}
	// Each "true &" leaves an orphan (or its zombie) to the subreaper.
	const orphans = `true & true & exit %d`

	// Without the reaper, the orphans stay zombies: the checks below can fail.
	if _, err := run(fmt.Sprintf(orphans, 0)); err != nil {
		t.Fatal(err)
	}
	if n := waitZombies(func(n int) bool { return n >= 2 }); n < 2 {
		t.Fatalf("%d zombie orphans without a reaper, want 2", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.ReapOrphans(ctx)
	if n := waitZombies(func(n int) bool { return n == 0 }); n != 0 {
		t.Fatalf("%d zombies left once the reaper runs", n)
	}

	t.Run("statuses kept under orphans", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for g := range 8 {
			wg.Go(func() {
				for i := range 25 {
					want := 1 + (g*25+i)%200
					got, err := run(fmt.Sprintf(orphans, want))
					if err == nil && got != want {
						err = fmt.Errorf("exit code %d, want %d", got, want)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n := waitZombies(func(n int) bool { return n == 0 }); n != 0 {
			t.Errorf("%d zombies left", n)
		}
	})

	t.Run("exited child of ours not yet waited for", func(t *testing.T) {
		// While it is a zombie it hides the orphans behind it from the
		// reaper's peek; it must keep its status, and its Wait must let
		// the reaper reach the rest.
		first := exec.Command("/bin/sh", "-c", "exit 5")
		if err := c.Start(first, first.Start); err != nil {
			t.Fatal(err)
		}
		if n := waitZombies(func(n int) bool { return n >= 1 }); n < 1 {
			t.Fatal("the first command never exited")
		}
		for range 3 {
			if _, err := run(fmt.Sprintf(orphans, 0)); err != nil {
				t.Fatal(err)
			}
		}
		err := c.Wait(first)
		if _, ok := errors.AsType[*exec.ExitError](err); !ok || first.ProcessState.ExitCode() != 5 {
			t.Fatalf("first command: %v, want exit status 5", err)
		}
		if n := waitZombies(func(n int) bool { return n == 0 }); n != 0 {
			t.Errorf("%d zombies left", n)
		}
	})
}

// waitZombies polls this process's zombie children until done accepts
// their number or 10 s pass, and returns the last number.
func waitZombies(done func(int) bool) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := zombieChildren(os.Getpid())
		if done(n) || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// zombieChildren counts the zombies whose parent is pid.
func zombieChildren(pid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}
