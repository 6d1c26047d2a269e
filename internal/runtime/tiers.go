package runtime

import (
	"fmt"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Tier is one isolation tier a server can run sandboxes on: a registered
// entry with a name (Spec.Runtime), a check that it can run here, the
// driver that runs it and how to tell its sandboxes. A microVM tier is one
// more entry.
type Tier struct {
	Name string
	// Available reports nil when the tier can run here, else an error
	// wrapping errdefs.ErrUnavailable that says how to install what it
	// needs. Nil means always available.
	Available func() error
	Driver    Runtime
	// Owns reports whether sandbox id runs on this tier (its state on
	// disk says so, also after a restart). Sandboxes no tier owns go to
	// the default tier. Nil owns none.
	Owns func(id string) bool
}

// Tiers is the registry of a server's tiers; the first is the default.
// It implements TierChecker, and Runtime with its optional capabilities by
// routing each call to the driver of the sandbox's tier (route.go).
type Tiers struct{ list []Tier }

// NewTiers registers tiers; names must be unique and non-empty.
func NewTiers(tiers ...Tier) (*Tiers, error) {
	ts := &Tiers{}
	for _, t := range tiers {
		if t.Name == "" || t.Driver == nil {
			return nil, fmt.Errorf("tier %q: a name and a driver are required: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		if slices.ContainsFunc(ts.list, func(o Tier) bool { return o.Name == t.Name }) {
			return nil, fmt.Errorf("tier %q registered twice: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		ts.list = append(ts.list, t)
	}
	if len(ts.list) == 0 {
		return nil, fmt.Errorf("no runtime tier registered: %w", errdefs.ErrInvalidArgument)
	}
	return ts, nil
}

// Names lists the registered tiers, the default first.
func (ts *Tiers) Names() []string {
	names := make([]string, len(ts.list))
	for i, t := range ts.list {
		names[i] = t.Name
	}
	return names
}

// Lookup returns tier name ("" is the default).
func (ts *Tiers) Lookup(name string) (Tier, error) {
	if name == "" {
		return ts.list[0], nil
	}
	for _, t := range ts.list {
		if t.Name == name {
			return t, nil
		}
	}
	return Tier{}, fmt.Errorf("runtime tier %q: this server runs %s: %w", name, strings.Join(ts.Names(), ", "), errdefs.ErrInvalidArgument)
}

// TierAvailable reports whether tier name is registered and can run here.
func (ts *Tiers) TierAvailable(name string) error {
	t, err := ts.Lookup(name)
	if err != nil {
		return err
	}
	if t.Available == nil {
		return nil
	}
	return t.Available()
}
