package harness

import (
	"net/netip"
	"testing"
)

func TestFreeSubnetSkipsTakenRanges(t *testing.T) {
	// Index 0 is 10.160.0.0/24; nothing on the host sits in 10.160/12 unless
	// a server of the harness runs, so two lookups from one index agree, and
	// every answer is a /24 inside 10.160.0.0/12.
	a, err := freeSubnet(0, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := freeSubnet(0, "")
	if a != b {
		t.Fatalf("freeSubnet is not deterministic: %v then %v", a, b)
	}
	for _, h := range []uint16{0, 1, 255, 256, 4095, 65535} {
		p, err := freeSubnet(h, "")
		if err != nil {
			t.Fatal(err)
		}
		if p.Bits() != 24 || !netip.MustParsePrefix("10.160.0.0/12").Contains(p.Addr()) {
			t.Errorf("freeSubnet(%d) = %v, want a /24 in 10.160.0.0/12", h, p)
		}
	}
	// The loopback range is taken by lo: a /24 overlapping it is never
	// handed out (checked through the overlap test the search uses).
	if !netip.MustParsePrefix("127.0.0.0/8").Overlaps(netip.MustParsePrefix("127.0.0.0/24")) {
		t.Fatal("Overlaps is not symmetric for nested prefixes")
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"e2e":                           "e2e",
		"Outside":                       "outside",
		"a/b c":                         "a-b-c",
		"averyveryverylongpackagenamex": "averyveryverylongpac",
	} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}
