package localrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string // "" for valid, else a substring of the error
	}{
		{"empty", Config{}, ""},
		{"all fields", Config{Read: []string{"~/.ssh/known_hosts"}, Write: []string{"~/.cache", "/var/tmp/x"},
			DenyRead: []string{"./secrets", "~/.config/*.key"}, AllowNet: []string{"example.com", "*.golang.org", "127.0.0.2"}}, ""},
		{"empty write", Config{Write: []string{"ok", ""}}, "write[1]"},
		{"NUL in read", Config{Read: []string{"a\x00b"}}, "read[0]"},
		{"bad glob", Config{DenyRead: []string{"[x"}}, "deny_read[0]"},
		{"bad domain", Config{AllowNet: []string{"a.com", "not a domain"}}, "allow_net[1]"},
		{"bare wildcard", Config{AllowNet: []string{"*"}}, "allow_net[0]"},
		{"inner wildcard", Config{AllowNet: []string{"a.*.com"}}, "allow_net[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body string
		want       string // error substring; "" for valid
	}{
		{"valid", `{"read":["~/.ssh/known_hosts"],"write":["out"],"deny_read":["x"],"allow_net":["example.com"],"no_default_deny":true}`, ""},
		{"unknown field", `{"writes":["out"]}`, `unknown field "writes"`},
		{"wrong type", `{"write":"out"}`, "write"},
		{"invalid entry", `{"allow_net":["bad name"]}`, "allow_net[0]"},
		{"not JSON", `write = ["out"]`, "invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".json")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(p, true)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("LoadConfig: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("LoadConfig: %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.json"), false); err != nil {
		t.Errorf("a missing optional config: %v, want nil", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.json"), true); err == nil {
		t.Error("a missing --config file was accepted")
	}
}

func TestMerge(t *testing.T) {
	got := Config{Write: []string{"a"}, AllowNet: []string{"x.com"}}.Merge(Config{Write: []string{"b"}, NoDefaultDeny: true})
	if strings.Join(got.Write, ",") != "a,b" || len(got.AllowNet) != 1 || !got.NoDefaultDeny {
		t.Fatalf("Merge = %+v", got)
	}
}
