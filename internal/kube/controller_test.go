package kube

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestNewRefuses checks the settings New refuses before it reaches a
// cluster: a node agent needs its capacity, the controller alone does not,
// and rates and workers cannot be negative.
func TestNewRefuses(t *testing.T) {
	base := Config{Teams: map[string]string{"agents": "team"}, LeaseNamespace: "agentbox-system",
		LeaseDuration: 15 * time.Second, MaxTimeout: time.Hour, Kubeconfig: "/nonexistent/kubeconfig"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"node agent without capacity", func(c *Config) { c.Node = "node-a" }, "--kube-node-cpu"},
		{"negative qps", func(c *Config) { c.QPS = -1 }, "--kube-qps"},
		{"negative workers", func(c *Config) { c.Workers = -1 }, "--kube-workers"},
		// Past validation, the missing kubeconfig is the first complaint.
		{"controller alone", func(c *Config) {}, "--kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			_, err := New(cfg, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: err = %v, want one naming %s", err, tc.want)
			}
		})
	}
}
