package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// ReadSpec reads the config.json of the bundle in dir.
func ReadSpec(dir string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return &s, nil
}

// UpdateConfig rewrites the bundle's config.json with fn applied.
func UpdateConfig(dir string, fn func(*specs.Spec)) error {
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	fn(&s)
	out, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// NS is what a bundle's config.json says of its namespaces.
type NS struct {
	NetPath string // the network namespace joined; "" when none is named
	OwnNet  bool   // the OCI runtime makes the netns, inside the sandbox's user namespace
	UserNS  bool
}

// ReadNS reads the namespaces of the bundle in dir.
func ReadNS(dir string) (NS, error) {
	var out NS
	s, err := ReadSpec(dir)
	if err != nil {
		return out, err
	}
	if s.Linux == nil {
		return out, nil
	}
	for _, ns := range s.Linux.Namespaces {
		switch ns.Type {
		case specs.NetworkNamespace:
			out.NetPath, out.OwnNet = ns.Path, ns.Path == ""
		case specs.UserNamespace:
			out.UserNS = true
		}
	}
	return out, nil
}

// OwnsNetNS reports whether the sandbox's netns is its own (made by the
// OCI runtime, no path).
func OwnsNetNS(dir string) bool {
	ns, err := ReadNS(dir)
	return err == nil && ns.OwnNet
}

// ErrNoNetNS: the sandbox runs in a netns its OCI runtime creates itself
// (tests without a network package).
var ErrNoNetNS = errors.New("no network namespace path")

// NetNSPath reads the network namespace path from the bundle's config.json.
func NetNSPath(dir string) (string, error) {
	ns, err := ReadNS(dir)
	if err != nil {
		return "", err
	}
	if ns.NetPath == "" {
		return "", fmt.Errorf("bundle %s: %w", dir, ErrNoNetNS)
	}
	return ns.NetPath, nil
}

// PidFile is where the OCI runtime writes the init pid of the bundle in
// dir when it creates, runs or restores it; it is removed first, so it is
// never stale.
func PidFile(dir string) string { return filepath.Join(dir, "init.pid") }

// ReadPid reads a pid file the OCI runtime has just written.
func ReadPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q: %w", path, b, errdefs.ErrUnavailable)
	}
	return pid, nil
}
