package bundle

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Host paths of a sandbox are named by an opaque key, HMAC(server secret,
// id), never by its id: overlay mount options (upperdir, workdir) are in
// /proc/self/mountinfo for every host user to read, and cgroup directories
// are world-listable. Without the secret a host user cannot tell which
// sandbox a key belongs to, nor compute the key of an id they know. The
// bundle records its id (idFile) for List after a restart.

// idFile holds the sandbox id in its bundle.
const idFile = "id"

// secretFile holds the server's key secret, beside the bundles.
const secretFile = ".key-secret"

// loadSecret reads the secret in stateDir, making it on first use.
func loadSecret(stateDir string) ([]byte, error) {
	p := filepath.Join(stateDir, secretFile)
	b, err := os.ReadFile(p)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("host path secret: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadSecret(stateDir) // another process made it first
		}
		return nil, fmt.Errorf("host path secret: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	return b, f.Close()
}

// key is sandbox id's opaque name on the host: 32 hex digits.
func (s *Store) key(id string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

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
		if !isKey(name) && validID.MatchString(name) {
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

// isKey reports whether name has the shape of a key.
func isKey(name string) bool {
	if len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil
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
	b, err := os.ReadFile(filepath.Join(stateDir, secretFile))
	if err != nil {
		return "", err
	}
	return (&Store{secret: b}).key(id), nil
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
