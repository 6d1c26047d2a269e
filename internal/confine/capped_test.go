package confine

import "testing"

func TestCapped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
		over   bool
	}{
		{"under the cap", []string{"ab", "c"}, "abc", false},
		{"exactly the cap", []string{"abcd"}, "abcd", false},
		{"one write past it", []string{"abcdef"}, "abcd", true},
		{"later writes dropped", []string{"abc", "de", "f"}, "abcd", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Capped{Max: 4}
			for _, w := range tc.writes {
				// The writer never fails, so a child is never stopped by it.
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if c.String() != tc.want || c.Over != tc.over {
				t.Errorf("kept %q over=%v, want %q over=%v", c.String(), c.Over, tc.want, tc.over)
			}
		})
	}
}
