package crashpoint

import "testing"

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		at, op, step string
		want         bool
	}{
		{"", "create", "start", false},
		{"create/start", "create", "start", true},
		{"create:start", "create", "start", true},
		{" kill/delete row ", "kill", "delete row", true},
		{"create/start", "fork", "start", false},
		{"create/start", "create", "register", false},
	} {
		if got := New(tc.at, nil).Matches(tc.op, tc.step); got != tc.want {
			t.Errorf("New(%q).Matches(%q, %q) = %v, want %v", tc.at, tc.op, tc.step, got, tc.want)
		}
	}
}
