package api

import (
	"testing"

	"github.com/agentbox/agentbox/internal/audit"
)

func TestDescribeAndEntry(t *testing.T) {
	tests := []struct {
		e     audit.Event
		msg   string
		level string
	}{
		{audit.Event{Kind: "process", Action: "exit", Fields: map[string]any{"cmd": "/bin/bash", "args": []any{"-c", "ls"}, "pid": 7, "exitCode": 2}},
			"process exit: /bin/bash -c ls pid=7 exitCode=2", "info"},
		{audit.Event{Kind: "file", Action: "write", Decision: audit.Denied, Reason: "permission denied", Fields: map[string]any{"path": "/etc/shadow"}},
			"file write path=/etc/shadow [denied]: permission denied", "warn"},
		{audit.Event{Kind: "limit", Action: "oom", Decision: audit.Denied, Reason: "out of memory"}, "limit oom [denied]: out of memory", "warn"},
		{audit.Event{Kind: "lifecycle", Action: "unhealthy", Reason: "envd gone"}, "lifecycle unhealthy: envd gone", "error"},
	}
	for _, tt := range tests {
		le := toLogEntry(tt.e)
		if le.Message != tt.msg || le.Level != tt.level {
			t.Errorf("got %q/%s, want %q/%s", le.Message, le.Level, tt.msg, tt.level)
		}
		if le.Fields["kind"] != tt.e.Kind || le.Fields["action"] != tt.e.Action {
			t.Errorf("fields %v", le.Fields)
		}
	}
}
