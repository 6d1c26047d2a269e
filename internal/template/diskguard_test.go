package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

type fullDisk struct{}

func (fullDisk) Admit(what string) error {
	return fmt.Errorf("cannot %s: the server's template disk is full: %w", what, errdefs.ErrNoSpace)
}

// TestDiskGuardRefusesBuildsAndUploads: on a full disk, builds and uploads
// are refused with ErrNoSpace before they write anything.
func TestDiskGuardRefusesBuildsAndUploads(t *testing.T) {
	s, err := NewStore(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.SetDiskGuard(fullDisk{})
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"upload", func() error {
			_, err := s.PutUpload("team", strings.Repeat("a", 64), strings.NewReader("x"), 1<<20, false)
			return err
		}},
		{"build", func() error {
			_, err := s.Build(context.Background(), Definition{}, nil, nil)
			return err
		}},
		{"build from spec", func() error {
			_, err := s.BuildFromSpec(context.Background(), BuildSpec{TeamID: "team", Name: "x"}, nil)
			return err
		}},
	} {
		if err := op.do(); !errors.Is(err, errdefs.ErrNoSpace) {
			t.Errorf("%s on a full disk: %v, want ErrNoSpace", op.name, err)
		}
	}
}
