package harness

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestLockInstance(t *testing.T) {
	dir := t.TempDir()
	first, err := lockInstance(dir, "e2e-pkg-1234abcd")
	if err != nil {
		t.Fatal(err)
	}
	// A second run of the same package (another open of the lock file, as
	// another process makes) is refused, and told who holds it.
	_, err = lockInstance(dir, "e2e-pkg-1234abcd")
	if err == nil {
		t.Fatal("a second lock of a held instance succeeded")
	}
	for _, want := range []string{"in use by another test run", fmt.Sprintf("pid %d", os.Getpid()), "e2e-pkg-1234abcd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	// Another instance is independent.
	other, err := lockInstance(dir, "e2e-pkg-99999999")
	if err != nil {
		t.Fatalf("another instance: %v", err)
	}
	other.release()
	first.release()
	first.release() // twice is harmless
	again, err := lockInstance(dir, "e2e-pkg-1234abcd")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.release()
}

func TestCheckFreeSpace(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		minMB   uint64
		wantErr bool
	}{
		{"no check", 0, false},
		{"room enough", 1, false},
		{"under the margin", 1 << 40, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkFreeSpace(tt.minMB, map[string]string{"the data dir": dir})
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && (!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "AGENTBOX_E2E_MIN_FREE_MB")) {
				t.Errorf("refusal %q names neither the dir nor how to change the margin", err)
			}
		})
	}
}

func TestMinFreeMB(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    uint64
		wantErr bool
	}{
		{"", DefaultMinFreeMB, false},
		{"0", 0, false},
		{"512", 512, false},
		{"lots", 0, true},
	} {
		t.Setenv("AGENTBOX_E2E_MIN_FREE_MB", tc.env)
		got, err := minFreeMB()
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("AGENTBOX_E2E_MIN_FREE_MB=%q: %d, %v; want %d, error %v", tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}
