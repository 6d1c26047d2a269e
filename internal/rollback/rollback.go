// Package rollback is the undo list of a multi-step setup (a sandbox's
// network, container, record): each step that made something pushes how to
// remove it, and a failure later runs the list newest first. Success
// releases it. The sandbox pipeline, the network manager and the runtime
// drivers share this one type, so "what is undone when step N fails" is
// answered the same way everywhere.
package rollback

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Undo removes what one step made. It must be safe to run after a partial
// success of that step (idempotent removal).
type Undo func(ctx context.Context) error

type entry struct {
	name string
	undo Undo
}

// List is an ordered list of undos. The zero value is ready to use; a List
// is not safe for concurrent use.
type List struct {
	entries []entry
}

// Add pushes the undo of the step called name.
func (l *List) Add(name string, undo Undo) {
	l.entries = append(l.entries, entry{name, undo})
}

// Names returns the names of the pushed undos, oldest first.
func (l *List) Names() []string {
	out := make([]string, len(l.entries))
	for i, e := range l.entries {
		out[i] = e.name
	}
	return out
}

// Run runs every undo newest first, even after one fails, and empties the
// list. ctx should not be the failed request's (a client gone away must
// not leave half a sandbox); pass context.WithoutCancel of it. The error
// joins every failed undo, each named by its step.
func (l *List) Run(ctx context.Context) error {
	var errs []error
	for _, e := range slices.Backward(l.entries) {
		if err := e.undo(ctx); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", e.name, err))
		}
	}
	l.entries = nil
	return errors.Join(errs...)
}

// Release forgets every undo: the setup succeeded and what it made stays.
func (l *List) Release() { l.entries = nil }
