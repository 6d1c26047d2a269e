package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/template"
)

func TestTemplateStoreDir(t *testing.T) {
	tests := []struct {
		name     string
		recorded string // "" writes no file
		flag     string
		want     func(dataDir string) string
	}{
		{"no record, no flag", "", "", func(d string) string { return filepath.Join(d, "templates") }},
		{"recorded store", "/var/cache/agentbox/templates\n", "", func(string) string { return "/var/cache/agentbox/templates" }},
		{"flag wins over record", "/var/cache/agentbox/templates\n", "/srv/t", func(string) string { return "/srv/t" }},
		{"relative record ignored", "templates-elsewhere\n", "", func(d string) string { return filepath.Join(d, "templates") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := t.TempDir()
			if tt.recorded != "" {
				if err := os.WriteFile(filepath.Join(dataDir, templateDirFile), []byte(tt.recorded), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := templateStoreDir(dataDir, tt.flag), tt.want(dataDir); got != want {
				t.Errorf("templateStoreDir = %q, want %q", got, want)
			}
		})
	}
}

// What serve records is what the operator commands then resolve.
func TestRecordTemplateDirRoundTrip(t *testing.T) {
	dataDir := t.TempDir()
	store := filepath.Join(t.TempDir(), "store")
	for range 2 { // the second record of the same dir is a no-op
		if err := recordTemplateDir(dataDir, store); err != nil {
			t.Fatal(err)
		}
	}
	if got := templateStoreDir(dataDir, ""); got != store {
		t.Errorf("templateStoreDir after record = %q, want %q", got, store)
	}
	fi, err := os.Stat(filepath.Join(dataDir, templateDirFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s mode %v, want 0600", templateDirFile, fi.Mode().Perm())
	}
}

func TestBuildEstimate(t *testing.T) {
	store, err := template.NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defs := template.BuiltinDefinitions()
	tests := []struct {
		name string
		want []string
	}{
		{"base", []string{"Building base into " + store.Dir(), "about 1-2 minutes"}},
		{"code-interpreter-v1", []string{"Building code-interpreter-v1", "2-4 minutes", "base first, about 1-2 minutes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := buildEstimate(t.Context(), store, defs[tt.name])
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("buildEstimate(%s) = %q, want %q in it", tt.name, msg, w)
				}
			}
		})
	}
}
