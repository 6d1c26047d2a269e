package bundle

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/hostkey"
)

// Host paths of a sandbox are named by an opaque key (internal/hostkey),
// never by its id: overlay mount options (upperdir, workdir) are in
// /proc/self/mountinfo for every host user to read, and cgroup directories
// are world-listable. Without the secret a host user cannot tell which
// sandbox a key belongs to, nor compute the key of an id they know. The
// bundle records its id (idFile) for List after a restart.

// idFile holds the sandbox id in its bundle.
const idFile = "id"

// secretFile holds the server's key secret, beside the bundles.
const secretFile = ".key-secret"

// key is sandbox id's opaque name on the host.
func (s *Store) key(id string) string { return s.keys.Key(id) }

// Dir is sandbox id's bundle directory. A bundle an earlier version named
// by the id itself is still found there.
func (s *Store) Dir(id string) string {
	legacy := filepath.Join(s.cfg.StateDir, id)
	if _, err := os.Lstat(legacy); err == nil {
		return legacy
	}
	return filepath.Join(s.cfg.StateDir, s.key(id))
}

// bundleID returns the sandbox id of the bundle named name in StateDir.
func (s *Store) bundleID(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(s.cfg.StateDir, name, idFile))
	if err != nil {
		if !hostkey.IsKey(name) && validID.MatchString(name) {
			return name, true // named by its id (earlier versions)
		}
		return "", false
	}
	id := strings.TrimSpace(string(b))
	if !validID.MatchString(id) || s.key(id) != name {
		return "", false // not a bundle this server made
	}
	return id, true
}

// SandboxOfCgroup names the sandbox whose cgroup is <CgroupParent>/name.
func (s *Store) SandboxOfCgroup(name string) (string, bool) {
	if strings.ContainsAny(name, "/.") || name == "" {
		return "", false
	}
	return s.bundleID(name)
}

// HostKey returns the name sandbox id's bundle and cgroup directories have
// on the host, for a server whose StateDir is stateDir: tests and operators
// (as root, who can read the secret) find a sandbox's host paths with it.
func HostKey(stateDir, id string) (string, error) {
	k, err := hostkey.Read(filepath.Join(stateDir, secretFile))
	if err != nil {
		return "", err
	}
	return k.Key(id), nil
}

// ContainerID is the name sandbox id's container has in its runtime: its
// key, since runc's and runsc's command lines (and runsc's long-lived
// sandbox processes) name the container for every host user to read in
// /proc. legacy reports whether the runtime already holds a container an
// earlier version named by the id itself; that one keeps its name.
func (s *Store) ContainerID(id string, legacy func(name string) bool) string {
	if legacy != nil && legacy(id) {
		return id
	}
	return s.key(id)
}

// SandboxOfContainer names the sandbox of a runtime's container called
// name (its key, or its id for a container of an earlier version).
func (s *Store) SandboxOfContainer(name string) (string, bool) {
	if strings.ContainsAny(name, "/") || name == "" {
		return "", false
	}
	return s.bundleID(name)
}
