package network

import (
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/hostkey"
)

// Two servers on one host may hold the same sandbox id at once (a moved
// suspended sandbox keeps it): their ports must not share a name, or one
// server's anti-spoofing rules and Detach reach the other's sandbox.
func TestVethNamesPerServer(t *testing.T) {
	server := func() *Manager {
		k, err := hostkey.Load(filepath.Join(t.TempDir(), keySecretFile))
		if err != nil {
			t.Fatal(err)
		}
		return &Manager{keys: k, legacyVeth: map[string]bool{}}
	}
	a, b := server(), server()
	for _, id := range []string{"i1abc", "x", "0123456789abcdefghij0123456789abcdefghij0123456789abcdefghij0123"} {
		if a.hostVeth(id) != a.hostVeth(id) {
			t.Errorf("%s: host end name not stable", id)
		}
		for _, name := range []string{a.hostVeth(id), a.peerVeth(id)} {
			if len(name) > 15 {
				t.Errorf("%s: interface name %q over 15 bytes", id, name)
			}
		}
		if a.hostVeth(id) == b.hostVeth(id) || a.peerVeth(id) == b.peerVeth(id) {
			t.Errorf("%s: two servers name its port the same (%s)", id, a.hostVeth(id))
		}
		if a.hostVeth(id) == legacyHostVeth(id) {
			t.Errorf("%s: port named by the id alone", id)
		}
	}
	a.legacyVeth["old"] = true
	if a.hostVeth("old") != legacyHostVeth("old") {
		t.Errorf("a port named by an earlier version lost its name")
	}
}
