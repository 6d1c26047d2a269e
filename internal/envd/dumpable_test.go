package envd

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestNonDumpableRefusesSameUser attacks a process the way sandbox code
// attacks envd: from the same uid, without CAP_SYS_PTRACE, it reads the
// victim's /proc/<pid>/environ and opens its /proc/<pid>/mem. That works
// against a dumpable victim (the control) and must fail against one that
// called SetNonDumpable.
func TestNonDumpableRefusesSameUser(t *testing.T) {
	if os.Getenv("ENVD_DUMPABLE_CHILD") != "" {
		if os.Getenv("ENVD_DUMPABLE_CHILD") == "off" {
			if err := SetNonDumpable(); err != nil {
				os.Exit(3)
			}
			if d, err := Dumpable(); err != nil || d {
				os.Exit(4)
			}
		}
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	testutil.RequireRoot(t)
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	// The test binary's build directory is not open to nobody.
	dir, err := os.MkdirTemp("", "dumpable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := dir + "/envd.test"
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode    string
		refused bool
	}{{"on", false}, {"off", true}} {
		t.Run("dumpable-"+tc.mode, func(t *testing.T) {
			victim := exec.Command(bin, "-test.run=^TestNonDumpableRefusesSameUser$")
			victim.Env = append(os.Environ(), "ENVD_DUMPABLE_CHILD="+tc.mode, "SECRET_TOKEN=hunter2")
			victim.SysProcAttr = nobody
			if err := victim.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })
			pid := strconv.Itoa(victim.Process.Pid)
			// Wait until the victim runs (its /proc files are its own) and,
			// for "off", has run SetNonDumpable (they turn root's).
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				var st syscall.Stat_t
				if syscall.Stat("/proc/"+pid+"/environ", &st) != nil {
					continue
				}
				if b, _ := os.ReadFile("/proc/" + pid + "/cmdline"); !strings.Contains(string(b), "-test.run") {
					continue
				}
				if tc.mode == "on" || st.Uid == 0 {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
			for _, attack := range [][]string{
				{"cat", "/proc/" + pid + "/environ"},
				{"sh", "-c", "exec 3</proc/" + pid + "/mem && echo opened"},
			} {
				a := exec.Command(attack[0], attack[1:]...)
				a.SysProcAttr = nobody
				out, err := a.CombinedOutput()
				got := err != nil
				if got != tc.refused {
					t.Errorf("%v against a dumpable=%s victim: err=%v out=%q; want refused=%v", attack, tc.mode, err, out, tc.refused)
				}
				if tc.refused && strings.Contains(string(out), "hunter2") {
					t.Errorf("%v read the victim's environment", attack)
				}
			}
		})
	}
}
