package network

import (
	"net/netip"
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

// Two servers on one host hold the same sandbox id: the first's sandbox is
// paused (its port gone, its address and rules kept, as a checkpoint
// leaves them) and the second restores it. The second's sandbox must be
// reachable, and stay so when the first removes its copy. With port names
// from the id alone, the first server's bridge anti-spoofing rules (bridge
// tables see every bridge of the host) matched the second's port and
// dropped everything it sent.
func TestSameIDOnTwoServers(t *testing.T) {
	ctx := t.Context()
	a := startManager(t, Config{Bridge: "abtest5", Subnet: netip.MustParsePrefix("10.99.5.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_twoa"})
	b := startManager(t, Config{Bridge: "abtest6", Subnet: netip.MustParsePrefix("10.99.6.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_twob"})
	const id = "sbsameid"
	if _, err := a.Attach(ctx, id, Policy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Detach(ctx, id) })
	if err := deleteLink(a.hostVeth(id)); err != nil { // paused on a
		t.Fatal(err)
	}
	ep, err := b.Attach(ctx, id, Policy{AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Detach(ctx, id) })
	if err := reachable(t, ep.NetNSPath, ep.IP); err != nil {
		t.Fatalf("the second server's sandbox %s: %v", id, err)
	}
	if err := a.Detach(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := reachable(t, ep.NetNSPath, ep.IP); err != nil {
		t.Fatalf("the second server's sandbox %s after the first removed its copy: %v", id, err)
	}
}
