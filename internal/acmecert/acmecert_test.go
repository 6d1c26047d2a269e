package acmecert

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func newTest(t *testing.T, known map[string]bool) *Manager {
	t.Helper()
	m, err := New(Config{
		Directory: "https://ca.invalid/dir", Domain: "sbx.test", CacheDir: filepath.Join(t.TempDir(), "acme"),
		Known: func(id string) bool { return known[id] }, PerSandbox: 2, PerHour: 3,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPolicy(t *testing.T) {
	m := newTest(t, map[string]bool{"aaa": true, "bbb": true, "ccc": true})
	clock := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	m.now = func() time.Time { return clock }
	if err := os.WriteFile(filepath.Join(m.cfg.CacheDir, "9000-ccc.sbx.test"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"8080-aaa.sbx.test", true},
		{"8080-aaa.sbx.test", true},  // the same host again: not counted twice
		{"8080-AAA.sbx.test.", true}, // case and the root dot
		{"3000-aaa.sbx.test", true},
		{"4000-aaa.sbx.test", false},   // a third port of aaa: over PerSandbox
		{"8080-zzz.sbx.test", false},   // no such sandbox
		{"sbx.test", false},            // not a port host
		{"8080-aaa.other.test", false}, // another domain
		{"8080-aaa.x.sbx.test", false}, // a deeper name
		{"080-aaa.sbx.test", false},    // not a canonical port
		{"70000-aaa.sbx.test", false},  // no such port
		{"8080-a_a.sbx.test", false},   // not an id
		{"9000-ccc.sbx.test", true},    // cached before a restart: not counted
		{"8080-bbb.sbx.test", true},    // third request this hour
		{"8081-bbb.sbx.test", false},   // fourth: over PerHour
	} {
		err := m.policy(t.Context(), tc.host)
		if (err == nil) != tc.ok {
			t.Errorf("policy(%q) = %v, want ok=%v", tc.host, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("policy(%q) = %v, not ErrRefused", tc.host, err)
		}
	}
	clock = clock.Add(61 * time.Minute)
	if err := m.policy(t.Context(), "8081-bbb.sbx.test"); err != nil {
		t.Errorf("an hour later: %v", err)
	}
}

func TestPrune(t *testing.T) {
	known := map[string]bool{"live": true}
	m := newTest(t, known)
	for _, name := range []string{"acme_account+key", "443-live.sbx.test", "443-gone.sbx.test", "443-gone.sbx.test+rsa"} {
		if err := os.WriteFile(filepath.Join(m.cfg.CacheDir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m.remember("gone", "443-gone.sbx.test")
	m.Prune()
	ents, _ := os.ReadDir(m.cfg.CacheDir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"443-live.sbx.test", "acme_account+key"}
	if len(left) != len(want) || left[0] != want[0] || left[1] != want[1] {
		t.Errorf("left %v, want %v", left, want)
	}
	if _, ok := m.hosts["gone"]; ok {
		t.Error("the gone sandbox's count stayed")
	}
	if fi, _ := os.Stat(m.cfg.CacheDir); fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode %v", fi.Mode().Perm())
	}
}
