// Package localrun is the local process tier, `agentbox run`: it runs one
// command as the current user on the host, with Landlock filesystem rules,
// a seccomp filter and a network namespace whose only way out is an
// allowlisting HTTP proxy, and explains every refusal on stderr.
package localrun

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/network"
)

// ConfigFile is the per-project config file looked for in the working
// directory when --config is not given.
const ConfigFile = ".agentbox.json"

// Config is what a command may touch. A project's .agentbox.json holds the
// same fields; flags add to them.
type Config struct {
	// Read re-allows reading paths the defaults deny (a credential store
	// the command needs). Everything else is readable already.
	Read []string `json:"read,omitempty"`
	// Write lists the directories and files the command may change, in
	// addition to the working directory and /tmp.
	Write []string `json:"write,omitempty"`
	// DenyRead lists more paths the command may not read, in addition to
	// DefaultDenyRead.
	DenyRead []string `json:"deny_read,omitempty"`
	// AllowNet lists the domains (or IP literals) the proxy lets the
	// command reach; "*.example.com" matches subdomains. Empty: no network.
	AllowNet []string `json:"allow_net,omitempty"`
	// NoDefaultDeny drops DefaultDenyRead.
	NoDefaultDeny bool `json:"no_default_deny,omitempty"`
}

// DefaultDenyRead are the credential stores denied by default, relative to
// the home directory ("~/") or the working directory ("./"). Glob patterns
// match names directly in that directory.
func DefaultDenyRead() []string {
	return []string{
		"~/.ssh", "~/.aws", "~/.gnupg", "~/.config/gcloud", "~/.kube",
		"~/.docker/config.json", "~/.netrc", "~/.git-credentials",
		"~/.config/gh/hosts.yml", "~/.azure", "~/.npmrc", "~/.pypirc",
		"./.env", "./.env.*",
	}
}

// LoadConfig reads a config file. A missing file is an error only when
// required (given with --config).
func LoadConfig(path string, required bool) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !required {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config %s: %w (fields: read, write, deny_read, allow_net, no_default_deny)", path, err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Merge returns c with the lists of o appended.
func (c Config) Merge(o Config) Config {
	return Config{
		Read:          append(append([]string(nil), c.Read...), o.Read...),
		Write:         append(append([]string(nil), c.Write...), o.Write...),
		DenyRead:      append(append([]string(nil), c.DenyRead...), o.DenyRead...),
		AllowNet:      append(append([]string(nil), c.AllowNet...), o.AllowNet...),
		NoDefaultDeny: c.NoDefaultDeny || o.NoDefaultDeny,
	}
}

// Validate checks every field; errors name the field and the entry.
func (c Config) Validate() error {
	for _, f := range []struct {
		name  string
		paths []string
	}{{"read", c.Read}, {"write", c.Write}, {"deny_read", c.DenyRead}} {
		for i, p := range f.paths {
			if err := checkPath(p); err != nil {
				return fmt.Errorf("%s[%d] %q: %w", f.name, i, p, err)
			}
		}
	}
	for i, d := range c.AllowNet {
		if _, err := network.ParseDomain(fmt.Sprintf("allow_net[%d]", i), d); err != nil {
			return err
		}
	}
	return nil
}

func checkPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case strings.ContainsRune(p, 0):
		return errors.New("path holds a NUL byte")
	case p != "/" && strings.HasSuffix(p, "/") && filepath.Clean(p) == "/":
		return errors.New("path is the root directory")
	}
	if _, err := filepath.Match(p, ""); err != nil {
		return fmt.Errorf("bad glob pattern: %w", err)
	}
	return nil
}

// expand makes p absolute: "~/" is the home directory, relative paths
// are under dir.
func expand(p, home, dir string) string {
	switch {
	case p == "~":
		return home
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(home, p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	}
	return filepath.Join(dir, p)
}
