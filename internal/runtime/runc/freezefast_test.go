package runc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestQuickFreeze drives quickFreeze on plain files standing in for a v1
// freezer.state (where a write is read back at once).
func TestQuickFreeze(t *testing.T) {
	cases := []struct {
		name    string
		initial string // "" for no file
		want    bool
		final   string
	}{
		{name: "thawed: frozen", initial: "THAWED\n", want: true, final: "FROZEN"},
		{name: "frozen by someone else: left to CRIU", initial: "FROZEN\n", want: false, final: "FROZEN\n"},
		{name: "freezing: left to CRIU", initial: "FREEZING\n", want: false, final: "FREEZING\n"},
		{name: "no freezer: left to CRIU", want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "freezer.state")
			if tc.initial != "" {
				if err := os.WriteFile(state, []byte(tc.initial), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := quickFreeze(context.Background(), state, quickFreezeWait); got != tc.want {
				t.Fatalf("quickFreeze = %v, want %v", got, tc.want)
			}
			b, _ := os.ReadFile(state)
			if string(b) != tc.final {
				t.Fatalf("freezer state %q after, want %q", b, tc.final)
			}
		})
	}
	if quickFreeze(context.Background(), "", quickFreezeWait) {
		t.Fatal("quickFreeze of no file = true")
	}
}

func TestCaughtExiting(t *testing.T) {
	for _, tc := range []struct {
		log  string
		want bool
	}{
		{"(00.005278) Error (criu/seize.c:882): Zombies with threads are not supported\n", true},
		{"(00.004000) Error (criu/seize.c:330): zombie 4242 (comm sh) found while seizing\n", true},
		{"(00.100000) Error (criu/seize.c:636): Unable to freeze cgroup /sys/fs/cgroup/freezer/x\n", false},
		{"", false},
	} {
		work := t.TempDir()
		if tc.log != "" {
			if err := os.WriteFile(filepath.Join(work, "dump.log"), []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := caughtExiting(work); got != tc.want {
			t.Errorf("caughtExiting(%q) = %v, want %v", tc.log, got, tc.want)
		}
	}
}
