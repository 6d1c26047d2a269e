package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/hostkey"
)

// A sandbox's netns pin and its address record are named by an opaque key
// (internal/hostkey), never by the id: every host user reads the pins' paths
// in /proc/self/mountinfo, and a sandbox id is half of what reaches the
// sandbox's data plane. The secret lives in the record directory (0700,
// beside the pins, on /run like them); each record holds the address and
// the id, so a restarted server maps keys back to sandboxes.

// keySecretFile holds the key secret in the record directory.
const keySecretFile = ".key-secret"

// recordDir is the directory of the address records, next to NetNSDir (so
// List, which reads NetNSDir, sees only namespaces).
func (m *Manager) recordDir() string { return m.cfg.NetNSDir + ".addr" }

// loadKeys reads the key secret, making it (and the record directory) on
// first use.
func loadKeys(dir string) (hostkey.Keyer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return hostkey.Keyer{}, fmt.Errorf("netns record dir: %w", err)
	}
	// An earlier version made it 0755; records name sandboxes now.
	if err := os.Chmod(dir, 0o700); err != nil {
		return hostkey.Keyer{}, fmt.Errorf("netns record dir: %w", err)
	}
	return hostkey.Load(filepath.Join(dir, keySecretFile))
}

// name is the file name of id's pin and record: its key, or the id itself
// for a sandbox an earlier version attached (its pin is still named so).
func (m *Manager) name(id string) string {
	if _, err := os.Lstat(filepath.Join(m.cfg.NetNSDir, id)); err == nil && !hostkey.IsKey(id) {
		return id
	}
	return m.keys.Key(id)
}

func (m *Manager) nsPath(id string) string { return filepath.Join(m.cfg.NetNSDir, m.name(id)) }

// addrPath is the record of a sandbox's address and id.
func (m *Manager) addrPath(id string) string { return filepath.Join(m.recordDir(), m.name(id)) }

func (m *Manager) writeAddr(id string, ip netip.Addr) error {
	if err := os.WriteFile(m.addrPath(id), []byte(ip.String()+"\n"+id+"\n"), 0o600); err != nil {
		return fmt.Errorf("address record: %w", err)
	}
	return nil
}

// readRecord reads the record named name: the address and, for records
// written since pins are keyed, the sandbox id ("" in older ones).
func (m *Manager) readRecord(name string) (netip.Addr, string, error) {
	b, err := os.ReadFile(filepath.Join(m.recordDir(), name))
	if err != nil {
		return netip.Addr{}, "", err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	ip, err := netip.ParseAddr(strings.TrimSpace(lines[0]))
	if err != nil || !m.cfg.Subnet.Contains(ip) {
		return netip.Addr{}, "", fmt.Errorf("address record %s: %q is not in %s", name, lines[0], m.cfg.Subnet)
	}
	id := ""
	if len(lines) > 1 {
		id = strings.TrimSpace(lines[1])
	}
	return ip, id, nil
}

func (m *Manager) readAddr(id string) (netip.Addr, error) {
	ip, _, err := m.readRecord(m.name(id))
	return ip, err
}

// pinned lists the sandboxes with a netns pin, by id, with each pin's file
// name. A keyed pin whose record is gone (or names no sandbox) cannot be
// mapped back: it is removed here, since nothing else could ever find it.
func (m *Manager) pinned() (map[string]string, error) {
	entries, err := os.ReadDir(m.cfg.NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read netns dir: %w", err)
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		name := e.Name()
		if !hostkey.IsKey(name) {
			out[name] = name // attached by an earlier version, named by id
			continue
		}
		_, id, err := m.readRecord(name)
		if err != nil || id == "" || m.keys.Key(id) != name {
			m.log.Warn("netns pin without a record naming its sandbox; removing it", "pin", name, "err", err)
			if err := removeNetNS(filepath.Join(m.cfg.NetNSDir, name)); err != nil {
				m.log.Warn("remove orphaned netns pin", "pin", name, "err", err)
			}
			_ = os.Remove(filepath.Join(m.recordDir(), name))
			continue
		}
		out[id] = name
	}
	return out, nil
}

// HostKey returns the name sandbox id's netns pin and address record have
// under netnsDir (a server's NetNSDir): tests and operators (as root, who
// can read the secret) find a sandbox's pin with it.
func HostKey(netnsDir, id string) (string, error) {
	k, err := hostkey.Read(filepath.Join(netnsDir+".addr", keySecretFile))
	if err != nil {
		return "", err
	}
	return k.Key(id), nil
}
