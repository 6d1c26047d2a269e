package runtime

import (
	"context"
	"errors"
	"regexp"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// nopRuntime is a driver that runs nothing, for registry tests only.
type nopRuntime struct{}

func (nopRuntime) Create(context.Context, Spec) error            { return nil }
func (nopRuntime) Delete(context.Context, string) error          { return nil }
func (nopRuntime) State(context.Context, string) (Status, error) { return StatusStopped, nil }
func (nopRuntime) Stats(context.Context, string) (Stats, error)  { return Stats{}, nil }
func (nopRuntime) List(context.Context) ([]string, error)        { return nil, nil }

func TestTiers(t *testing.T) {
	missing := errors.New("install it")
	ts, err := NewTiers(
		Tier{Name: "runc", Driver: nopRuntime{}},
		Tier{Name: "runsc", Driver: nopRuntime{}, Available: func() error { return errors.Join(missing, errdefs.ErrUnavailable) }},
	)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := ts.Lookup(""); err != nil || d.Name != "runc" {
		t.Fatalf("default tier %q, %v", d.Name, err)
	}
	for name, want := range map[string]error{"": nil, "runc": nil, "runsc": errdefs.ErrUnavailable, "kata": errdefs.ErrInvalidArgument} {
		err := ts.TierAvailable(name)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("TierAvailable(%q) = %v, want %v", name, err, want)
		}
	}
	for _, bad := range [][]Tier{nil, {{Name: "", Driver: nopRuntime{}}}, {{Name: "x"}}, {{Name: "x", Driver: nopRuntime{}}, {Name: "x", Driver: nopRuntime{}}}} {
		if _, err := NewTiers(bad...); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("NewTiers(%v) = %v", bad, err)
		}
	}
}

func TestNewBootID(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := NewBootID(), NewBootID()
	for _, id := range []string{a, b} {
		if !shape.MatchString(id) {
			t.Fatalf("NewBootID() = %q, want the kernel's boot_id shape (a version 4 UUID)", id)
		}
	}
	if a == b {
		t.Fatalf("two boots share the id %q", a)
	}
}
