// Package errdefs is the one error vocabulary of agentbox. Packages wrap these
// sentinels with context (fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound))
// and the edges (REST, Connect, CLI) map them to wire codes in one place.
package errdefs

import "errors"

var (
	// ErrNotFound: the named thing does not exist (or belongs to another team).
	ErrNotFound = errors.New("not found")
	// ErrInvalidArgument: the request is malformed; the message names the field.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrConflict: the thing exists already or is in a state that forbids the call.
	ErrConflict = errors.New("conflict")
	// ErrUnauthenticated: missing or wrong credentials.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrResourceExhausted: a limit or quota was hit.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnavailable: a dependency (runtime, envd) is not ready or gone.
	ErrUnavailable = errors.New("unavailable")
	// ErrTooLarge: a body or field exceeds its size limit.
	ErrTooLarge = errors.New("too large")
	// ErrNoSpace: a write did not fit in the space left (a full volume).
	ErrNoSpace = errors.New("no space left")
)
