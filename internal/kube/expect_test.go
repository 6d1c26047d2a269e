package kube

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestCreations(t *testing.T) {
	var c creations
	c.add("p1", "a")
	c.add("p1", "b")
	c.add("p2", "x")
	for _, tc := range []struct {
		name string
		pool string
		seen map[string]bool
		want int
	}{
		{"nothing seen yet", "p1", nil, 2},
		{"one seen", "p1", map[string]bool{"a": true}, 1},
		{"a seen create is forgotten", "p1", nil, 1},
		{"other pools are apart", "p2", nil, 1},
		{"unknown pool", "p3", nil, 0},
	} {
		if got := c.pending(types.UID(tc.pool), func(n string) bool { return tc.seen[n] }); got != tc.want {
			t.Errorf("%s: pending = %d, want %d", tc.name, got, tc.want)
		}
	}
	// A create the cache never shows stops counting after the window.
	c.byPool["p1"]["b"] = time.Now().Add(-expectWindow - time.Second)
	if got := c.pending("p1", func(string) bool { return false }); got != 0 {
		t.Errorf("expired create: pending = %d, want 0", got)
	}
	c.forget("p2")
	if got := c.pending("p2", func(string) bool { return false }); got != 0 {
		t.Errorf("after forget: pending = %d, want 0", got)
	}
}
