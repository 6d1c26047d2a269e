package runtime

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The registry is the Runtime the sandbox manager talks to: a create goes
// to the driver of Spec.Runtime, every later call to the driver of the tier
// that owns the sandbox. A capability a tier's driver lacks is reported as
// errdefs.ErrUnavailable for that sandbox.
var (
	_ Runtime          = (*Tiers)(nil)
	_ Checkpointer     = (*Tiers)(nil)
	_ CheckpointProber = (*Tiers)(nil)
	_ LimitReporter    = (*Tiers)(nil)
	_ TierChecker      = (*Tiers)(nil)
)

// driverOf returns the driver of the tier owning sandbox id (the default
// tier's when none does).
func (ts *Tiers) driverOf(id string) Tier {
	for _, t := range ts.list {
		if t.Owns != nil && t.Owns(id) {
			return t
		}
	}
	return ts.list[0]
}

// Create starts the sandbox on the driver of spec.Runtime.
func (ts *Tiers) Create(ctx context.Context, spec Spec) error {
	t, err := ts.Lookup(spec.Runtime)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if t.Available != nil {
		if err := t.Available(); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	return t.Driver.Create(ctx, spec)
}

// Delete removes the sandbox on the driver of its tier.
func (ts *Tiers) Delete(ctx context.Context, id string) error {
	return ts.driverOf(id).Driver.Delete(ctx, id)
}

// State asks the driver of the sandbox's tier.
func (ts *Tiers) State(ctx context.Context, id string) (Status, error) {
	return ts.driverOf(id).Driver.State(ctx, id)
}

// Stats asks the driver of the sandbox's tier.
func (ts *Tiers) Stats(ctx context.Context, id string) (Stats, error) {
	return ts.driverOf(id).Driver.Stats(ctx, id)
}

// List returns the sandboxes every driver has state for, sorted.
func (ts *Tiers) List(ctx context.Context) ([]string, error) {
	var ids []string
	for _, t := range ts.list {
		l, err := t.Driver.List(ctx)
		if err != nil {
			return nil, err
		}
		ids = append(ids, l...)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// capability returns the driver of sandbox id's tier as a C.
func capability[C any](ts *Tiers, id, what string) (C, error) {
	t := ts.driverOf(id)
	c, ok := t.Driver.(C)
	if !ok {
		return c, fmt.Errorf("sandbox %s: the %s tier cannot %s: %w", id, t.Name, what, errdefs.ErrUnavailable)
	}
	return c, nil
}

// Freeze freezes the sandbox on the driver of its tier.
func (ts *Tiers) Freeze(ctx context.Context, id string) error {
	f, err := capability[Freezer](ts, id, "freeze sandboxes")
	if err != nil {
		return err
	}
	return f.Freeze(ctx, id)
}

// Thaw thaws the sandbox on the driver of its tier.
func (ts *Tiers) Thaw(ctx context.Context, id string) error {
	f, err := capability[Freezer](ts, id, "freeze sandboxes")
	if err != nil {
		return err
	}
	return f.Thaw(ctx, id)
}

// Checkpoint checkpoints the sandbox on the driver of its tier.
func (ts *Tiers) Checkpoint(ctx context.Context, id string, opts CheckpointOptions) error {
	c, err := capability[Checkpointer](ts, id, "checkpoint sandboxes")
	if err != nil {
		return err
	}
	return c.Checkpoint(ctx, id, opts)
}

// Restore restores in place on the driver of the sandbox's tier, or a new
// sandbox on the driver of spec.Runtime.
func (ts *Tiers) Restore(ctx context.Context, spec Spec, opts RestoreOptions) error {
	t := ts.driverOf(spec.ID)
	if !slices.ContainsFunc(ts.list, func(o Tier) bool { return o.Owns != nil && o.Owns(spec.ID) }) {
		var err error
		if t, err = ts.Lookup(spec.Runtime); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	c, ok := t.Driver.(Checkpointer)
	if !ok {
		return fmt.Errorf("sandbox %s: the %s tier cannot restore sandboxes: %w", spec.ID, t.Name, errdefs.ErrUnavailable)
	}
	return c.Restore(ctx, spec, opts)
}

// HasCheckpoint asks the driver of the sandbox's tier.
func (ts *Tiers) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	c, ok := ts.driverOf(id).Driver.(Checkpointer)
	if !ok {
		return false, nil
	}
	return c.HasCheckpoint(ctx, id)
}

// DropCheckpoint asks the driver of the sandbox's tier.
func (ts *Tiers) DropCheckpoint(ctx context.Context, id string) error {
	c, ok := ts.driverOf(id).Driver.(Checkpointer)
	if !ok {
		return nil
	}
	return c.DropCheckpoint(ctx, id)
}

// CheckpointSupported reports whether the default tier can checkpoint on
// this host: the manager asks once for the server, before any sandbox.
func (ts *Tiers) CheckpointSupported() error {
	t := ts.list[0]
	if _, ok := t.Driver.(Checkpointer); !ok {
		return fmt.Errorf("the %s tier cannot checkpoint sandboxes: %w", t.Name, errdefs.ErrUnavailable)
	}
	if p, ok := t.Driver.(CheckpointProber); ok {
		return p.CheckpointSupported()
	}
	return nil
}

// LimitCounters asks the driver of the sandbox's tier.
func (ts *Tiers) LimitCounters(ctx context.Context, id string) (LimitCounters, error) {
	l, err := capability[LimitReporter](ts, id, "report limit hits")
	if err != nil {
		return LimitCounters{}, err
	}
	return l.LimitCounters(ctx, id)
}
