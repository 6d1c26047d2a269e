package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadTokenSecret(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("k", 48)
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string // "" = accepted
	}{
		{"private and long", long, 0o600, ""},
		{"read-only owner", long, 0o400, ""},
		{"group readable", long, 0o640, "chmod 600"},
		{"world readable", long, 0o644, "chmod 600"},
		{"short", "short", 0o600, "at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(p, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tc.mode); err != nil {
				t.Fatal(err)
			}
			got, err := readTokenSecret(p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && string(got) != tc.content:
				t.Fatalf("read %q", got)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--token-secret-file")):
				t.Fatalf("error %v, want one naming --token-secret-file and %q", err, tc.want)
			}
		})
	}
	if _, err := readTokenSecret(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

func TestAdvertiseAddress(t *testing.T) {
	t.Setenv("POD_IP", "")
	for _, tc := range []struct{ flag, listen, pod, want string }{
		{"10.0.0.1:3000", "127.0.0.1:4000", "", "10.0.0.1:3000"},
		{"", "127.0.0.1:4000", "", "127.0.0.1:4000"},
		{"", "0.0.0.0:3000", "10.1.2.3", "10.1.2.3:3000"},
		{"", "0.0.0.0:3000", "", ""},
		{"nohostport", "127.0.0.1:3000", "", ""},
	} {
		t.Setenv("POD_IP", tc.pod)
		got, err := advertiseAddress(tc.flag, tc.listen)
		if tc.want == "" {
			if err == nil {
				t.Errorf("advertiseAddress(%q, %q) = %q, want an error", tc.flag, tc.listen, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("advertiseAddress(%q, %q) = %q, %v; want %q", tc.flag, tc.listen, got, err, tc.want)
		}
	}
}
