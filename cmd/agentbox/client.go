package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// newClient builds the SDK client from the persistent flags, the
// environment and the local key file.
func newClient(cmd *cobra.Command, extra ...agentbox.Option) *agentbox.Client {
	opts := extra
	if u, _ := cmd.Flags().GetString("api-url"); u != "" {
		opts = append(opts, agentbox.WithAPIURL(u))
	}
	key, _ := cmd.Flags().GetString("api-key")
	if key == "" && os.Getenv("AGENTBOX_API_KEY") == "" && os.Getenv("E2B_API_KEY") == "" {
		key = localAPIKey()
	}
	if key != "" {
		opts = append(opts, agentbox.WithAPIKey(key))
	}
	return agentbox.New(opts...)
}

// localAPIKey reads the key `agentbox serve` wrote to its data directory,
// so the CLI works without setup on the server's host.
func localAPIKey() string {
	b, err := os.ReadFile(filepath.Join(defaultDataDir(), "apikey"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// connect attaches to a sandbox to reach its data plane. It never shortens
// the sandbox's life.
func connect(ctx context.Context, cmd *cobra.Command, id string) (*agentbox.Sandbox, error) {
	return newClient(cmd).Connect(ctx, id, 0)
}

// parsePairs turns ["k=v", ...] into a map.
func parsePairs(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, p)
		}
		m[k] = v
	}
	return m, nil
}
