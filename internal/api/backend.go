package api

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// Backend runs the sandboxes the E2B API names: the local manager
// (LocalBackend) or the Kubernetes tier (internal/kubeapi). The API layer
// reads and checks every request, maps errors and shapes every answer; a
// backend only does what it is asked for the team it is given, and answers
// an id the team does not own exactly like an unknown one
// (errdefs.ErrNotFound). Errors use the errdefs vocabulary.
type Backend interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	// List is the team's sandboxes, newest first.
	List(ctx context.Context, team string) ([]*sandbox.Sandbox, error)
	Get(ctx context.Context, team, id string) (*sandbox.Sandbox, error)
	Kill(ctx context.Context, team, id string) error
	// SetTimeout sets the sandbox's end to d from now.
	SetTimeout(ctx context.Context, team, id string, d time.Duration) error
	// Extend moves a running sandbox's end to at least d from now.
	Extend(ctx context.Context, team, id string, d time.Duration) (*sandbox.Sandbox, error)
	// Pause pauses with the memory kept, or only the files (memory false).
	Pause(ctx context.Context, team, id string, memory bool) error
	// Resume resumes a paused sandbox for d (from its memory image, or a
	// fresh boot on its files with memory false); resumed is false when
	// it was running (and is unchanged).
	Resume(ctx context.Context, team, id string, d time.Duration, memory bool) (sb *sandbox.Sandbox, resumed bool, err error)
	CreateSnapshot(ctx context.Context, team, id, name string, memory bool) (*sandbox.Snapshot, error)
	// ListSnapshots is the team's snapshots in a stable order, filtered by
	// sandbox id and name when they are not empty.
	ListSnapshots(ctx context.Context, team, sandboxID, name string) ([]*sandbox.Snapshot, error)
	// DeleteSnapshot deletes the team's snapshot ref; found is false (and
	// nothing done) when the team has none by that id or name.
	DeleteSnapshot(ctx context.Context, team, ref string) (found bool, err error)
	// CheckNetwork refuses a network policy the backend cannot give the
	// team, naming the field.
	CheckNetwork(ctx context.Context, team string, allowInternet bool, n *sandbox.NetworkSpec) error
	// Tokens are the sandbox's envd access token and traffic token.
	Tokens(ctx context.Context, id string) (envd, traffic string)
	// Readiness is the body and verdict of GET /ready.
	Readiness(ctx context.Context) (body any, ready bool)
}

// Keys looks up the owner of an API key: errdefs.ErrUnauthenticated when
// the key is not one.
type Keys interface {
	Authenticate(ctx context.Context, key string) (store.APIKey, error)
}
