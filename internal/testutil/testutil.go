// Package testutil holds helpers shared by tests.
package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips a test that needs root, unless AGENTBOX_REQUIRE_ROOT=1
// (set by CI), in which case the missing privilege fails the test: nothing is
// silently skipped in CI.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("AGENTBOX_REQUIRE_ROOT") == "1" {
		t.Fatal("this test needs root and AGENTBOX_REQUIRE_ROOT=1 forbids skipping it")
	}
	t.Skip("needs root")
}
