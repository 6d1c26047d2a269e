package harness

import (
	"slices"
	"testing"
)

func TestNftElements(t *testing.T) {
	listing := `table inet agentbox {
	set sandboxes {
		type ipv4_addr
		elements = { 10.1.0.2, 10.1.0.3 }
	}
	map policy {
		type ipv4_addr : verdict
		elements = { 10.1.0.2 : jump allow_a }
	}
	set empty {
		type ipv4_addr
	}
	chain forward {
		ip saddr @sandboxes counter packets 3 bytes 120 drop
	}
}`
	got := nftElements(listing)
	want := []string{"sandboxes 10.1.0.2", "sandboxes 10.1.0.3", "policy 10.1.0.2 : jump allow_a"}
	if !slices.Equal(got, want) {
		t.Fatalf("nftElements = %q, want %q", got, want)
	}
}

func TestLeaked(t *testing.T) {
	before := HostState{KindMount: {"/d/a"}, KindRow: {"sandboxes x running"}}
	after := HostState{KindMount: {"/d/a", "/d/b"}, KindRow: {"sandboxes x running"}, KindVeth: {"veth1"}}
	got := before.Leaked(after)
	want := []string{"mount: /d/b", "veth: veth1"}
	if !slices.Equal(got, want) {
		t.Fatalf("Leaked = %q, want %q", got, want)
	}
	if got := after.Leaked(before); len(got) != 0 {
		t.Fatalf("removals are not leaks: %q", got)
	}
}
