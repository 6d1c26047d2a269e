package api

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// LocalBackend serves the E2B API from this host's sandbox manager.
type LocalBackend struct{ M *sandbox.Manager }

var _ Backend = LocalBackend{}

func (b LocalBackend) Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error) {
	return b.M.Create(ctx, req)
}

func (b LocalBackend) List(ctx context.Context, team string) ([]*sandbox.Sandbox, error) {
	return b.M.List(ctx, team), nil
}

func (b LocalBackend) Get(ctx context.Context, team, id string) (*sandbox.Sandbox, error) {
	return b.M.Get(ctx, team, id)
}

func (b LocalBackend) Kill(ctx context.Context, team, id string) error {
	return b.M.Kill(ctx, team, id)
}

func (b LocalBackend) SetTimeout(ctx context.Context, team, id string, d time.Duration) error {
	return b.M.SetTimeout(ctx, team, id, d)
}

func (b LocalBackend) Extend(ctx context.Context, team, id string, d time.Duration) (*sandbox.Sandbox, error) {
	return b.M.Extend(ctx, team, id, d)
}

func (b LocalBackend) Pause(ctx context.Context, team, id string, memory bool) error {
	if !memory {
		return b.M.PauseFilesystem(ctx, team, id)
	}
	return b.M.Pause(ctx, team, id)
}

func (b LocalBackend) Resume(ctx context.Context, team, id string, d time.Duration, memory bool) (*sandbox.Sandbox, bool, error) {
	if !memory {
		return b.M.ResumeFromFiles(ctx, team, id, d)
	}
	return b.M.Resume(ctx, team, id, d, false)
}

func (b LocalBackend) CreateSnapshot(ctx context.Context, team, id, name string, memory bool) (*sandbox.Snapshot, error) {
	if !memory {
		return b.M.Snapshots().CreateFilesystemSnapshot(ctx, team, id, name)
	}
	return b.M.Snapshots().CreateSnapshot(ctx, team, id, name)
}

func (b LocalBackend) ListSnapshots(ctx context.Context, team, sandboxID, name string) ([]*sandbox.Snapshot, error) {
	return b.M.Snapshots().ListSnapshots(ctx, team, sandboxID, name), nil
}

func (b LocalBackend) DeleteSnapshot(ctx context.Context, team, ref string) (bool, error) {
	ss := b.M.Snapshots()
	if !ss.IsSnapshot(team, ref) {
		return false, nil
	}
	return true, ss.DeleteSnapshot(ctx, team, ref)
}

func (b LocalBackend) CheckNetwork(ctx context.Context, team string, allowInternet bool, n *sandbox.NetworkSpec) error {
	return b.M.CheckNetwork(ctx, team, allowInternet, n)
}

func (b LocalBackend) Tokens(_ context.Context, id string) (envd, traffic string) {
	return b.M.Token(id), b.M.TrafficToken(id)
}

func (b LocalBackend) Readiness(ctx context.Context) (any, bool) {
	rd := b.M.Readiness(ctx)
	return rd, rd.Ready
}
