package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/store"
)

func TestTeamQuotaCmd(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	team, _ := st.EnsureTeam(ctx, "research")
	st.Close()

	run := func(args ...string) (string, error) {
		cmd := newTeamCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(args, "--data-dir", dir))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	tests := []struct {
		name    string
		args    []string
		wantOut string // substring of the output
		wantErr string // substring of the error; "" = no error
	}{
		{"negative names the flag", []string{"quota", "set", "research", "--memory-mb", "-1"}, "", "--memory-mb: must not be negative"},
		{"nothing to set", []string{"quota", "set", "research"}, "", "nothing to set"},
		{"unknown team", []string{"quota", "get", "nope"}, "", "agentbox team ls"},
		{"set by name", []string{"quota", "set", "research", "--memory-mb", "512", "--max-sandboxes", "2"}, "", ""},
		{"set keeps other fields", []string{"quota", "set", team.ID, "--cpu", "1"}, "", ""},
		{"get", []string{"quota", "get", "research"}, "memoryMB      512", ""},
		{"get shows defaults", []string{"quota", "get", "research"}, "diskSizeMB    default (51200)", ""},
		{"ls", []string{"ls"}, "research", ""},
		{"zero resets a field", []string{"quota", "set", "research", "--memory-mb", "0"}, "", ""},
		{"get after reset", []string{"quota", "get", "research"}, "memoryMB      default (16384)", ""},
		{"clear", []string{"quota", "clear", "research"}, "", ""},
		{"get after clear", []string{"quota", "get", "research"}, "maxSandboxes  default (no cap)", ""},
	}
	for _, tt := range tests {
		out, err := run(tt.args...)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want one containing %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !strings.Contains(out, tt.wantOut) {
			t.Errorf("%s: %q, %v; want output containing %q", tt.name, out, err, tt.wantOut)
		}
	}
	st, _ = store.Open(ctx, filepath.Join(dir, "agentbox.db"))
	defer st.Close()
	if _, ok, _ := st.TeamQuota(ctx, team.ID); ok {
		t.Error("quota row left after clear")
	}
}
