package sandbox

import (
	"errors"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestCheckChosenID(t *testing.T) {
	m := &Manager{sandboxes: map[string]*Sandbox{"itaken": {ID: "itaken"}}}
	for _, tc := range []struct {
		id   string
		want error
	}{
		{NewID(), nil},
		{"ifree", nil},
		{"itaken", errdefs.ErrConflict},
		{"I-Bad", errdefs.ErrInvalidArgument},
		{"x", errdefs.ErrInvalidArgument},
	} {
		err := m.checkChosenID(tc.id)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("checkChosenID(%q) = %v, want %v", tc.id, err, tc.want)
		}
	}
	if id := NewID(); !ValidID(id) {
		t.Errorf("NewID() = %q is not a valid id", id)
	}
}
