package envd

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// testReaper is a copy of this test binary every test user may run: the
// envd servers of the tests start their commands under it ("reap" mode of
// TestMain), as envd does with its own binary.
var testReaper string

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "reap" && (os.Args[2] == "--" || os.Args[2] == "--cred") {
		os.Exit(RunReaper(os.Args[2:]))
	}
	if len(os.Args) == 3 && os.Args[1] == "reap" && os.Args[2] == "--spare" {
		os.Exit(RunSpareReaper())
	}
	if os.Getenv("ENVD_DUMPABLE_CHILD") != "" || os.Getenv(subreaperChildEnv) != "" {
		os.Exit(m.Run()) // a victim of TestNonDumpableRefusesSameUser, or TestChildren's subreaper
	}
	dir, err := os.MkdirTemp("", "envd-reaper")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	self, err := os.ReadFile(os.Args[0])
	if err == nil {
		testReaper = filepath.Join(dir, "envd")
		err = os.WriteFile(testReaper, self, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "copy the test binary for the reaper:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
