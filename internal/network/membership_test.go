package network

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
)

// The no_internet set holds a sandbox's address exactly while its policy
// denies the internet: through policy changes both ways, across a
// restart of the manager, and not after Detach. (applyPolicy and Detach
// skip the set where membership does not change.)
func TestNoInternetMembershipFollowsPolicy(t *testing.T) {
	cfg := Config{Bridge: "abnset0", Subnet: netip.MustParsePrefix("10.97.0.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_nset"}
	m := startManager(t, cfg)
	ctx := t.Context()
	member := func(t *testing.T, m *Manager, ip netip.Addr, want bool, when string) {
		t.Helper()
		denied, err := m.readNoInternet()
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(denied, ip); got != want {
			t.Fatalf("%s: %s in no_internet = %v, want %v (set %v)", when, ip, got, want, denied)
		}
	}
	denied, err := m.Attach(ctx, "sbdeny", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := m.Attach(ctx, "sballow", Policy{AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	member(t, m, denied.IP, true, "attached denied")
	member(t, m, allowed.IP, false, "attached allowed")
	for i, step := range []struct {
		allow bool
		want  bool
	}{{true, false}, {true, false}, {false, true}, {false, true}, {true, false}, {false, true}} {
		if err := m.SetPolicy(ctx, "sbdeny", Policy{AllowInternet: step.allow}); err != nil {
			t.Fatal(err)
		}
		member(t, m, denied.IP, step.want, "policy change "+string(rune('0'+i)))
	}

	// A restarted manager learns membership from the set and removes it
	// on Detach.
	m2, err := New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	member(t, m2, denied.IP, true, "after restart")
	for _, id := range []string{"sbdeny", "sballow"} {
		if err := m2.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	member(t, m2, denied.IP, false, "after Detach")
	member(t, m2, allowed.IP, false, "after Detach")

	// The address comes back on a new sandbox with the internet: not a member.
	again, err := m2.Attach(ctx, "sbnew", Policy{AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	member(t, m2, again.IP, false, "new sandbox")
	if err := m2.Detach(ctx, "sbnew"); err != nil {
		t.Fatal(err)
	}
}

// A restart re-installs every attached sandbox's rules in one transaction:
// with 150 sandboxes its acknowledgements must not overflow the netlink
// socket (ENOBUFS), which would keep the server from starting.
func TestSetupWithManySandboxes(t *testing.T) {
	cfg := Config{Bridge: "abnmany0", Subnet: netip.MustParsePrefix("10.96.0.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_nmany"}
	m := startManager(t, cfg)
	ctx := t.Context()
	const n = 150
	// Before the attaches: a failed one must not leave the others behind.
	t.Cleanup(func() {
		for i := range n {
			_ = m.Detach(context.Background(), fmt.Sprintf("many%03d", i))
		}
	})
	for i := range n {
		if _, err := m.Attach(ctx, fmt.Sprintf("many%03d", i), Policy{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
	}
	m2, err := New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Setup(ctx); err != nil {
		t.Fatalf("Setup with %d sandboxes attached: %v", n, err)
	}
	c, err := nftablesConn()
	if err != nil {
		t.Fatal(err)
	}
	if p, a := spoofSetSizes(t, c, cfg); p < n || a < n {
		t.Fatalf("anti-spoofing elements for %d ports and %d addresses after the restart, want %d", p, a, n)
	}
}
