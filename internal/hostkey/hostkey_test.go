package hostkey

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), ".key-secret")
	// Concurrent first uses must agree on one secret.
	keys := make([]string, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := Load(p)
			if err != nil {
				t.Error(err)
				return
			}
			keys[i] = k.Key("sandbox-1")
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if k != keys[0] {
			t.Fatalf("concurrent loads disagree: %q vs %q", k, keys[0])
		}
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret mode = %v, %v; want 0600", fi.Mode(), err)
	}
	k, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  string
		want bool // is a key
	}{
		{"key of an id", k.Key("sandbox-1"), true},
		{"the id itself", "sandbox-1", false},
		{"33 hex digits", k.Key("x") + "a", false},
		{"not hex", "zz" + k.Key("x")[2:], false},
	}
	for _, tc := range tests {
		if got := IsKey(tc.got); got != tc.want {
			t.Errorf("%s: IsKey(%q) = %v, want %v", tc.name, tc.got, got, tc.want)
		}
	}
	if k.Key("sandbox-1") != keys[0] || k.Key("sandbox-1") == k.Key("sandbox-2") {
		t.Error("keys are not a function of the id")
	}
}
