package sandbox

import (
	"context"
	"iter"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// starter runs the start pipelines of pipeline.go: every step function is
// one of its methods, so following a create, a restore, a claim, a fork, a
// resume or a build step is reading one list of steps and the methods it
// names. It touches the host (runtime, network, envd) itself and the
// records only through recs.
type starter struct {
	cfg       Config // MaxTimeout, MaxCommandLifetime
	log       *slog.Logger
	inst      *instruments
	rt        runtime.Runtime
	net       Network
	templates Templates
	envd      *envdLink
	admission *admission
	policies  policies
	rows      rows
	vols      Volumes               // nil: no volume mounts (Options.Volumes)
	snaps     func() *snapshotStore // nil store: no lifecycle features
	recs      records
}

// records is what the parts need of the manager's records and their state
// machine: the manager keeps the sandboxes; a start step, a pause, a
// snapshot, the reaper or a sampler asks it.
type records interface {
	// Get is a copy of the team's live record of sandbox id.
	Get(ctx context.Context, teamID, id string) (*Sandbox, error)
	// register makes sb visible to the API, the gateway and the reaper.
	register(sb *Sandbox)
	// begin moves sandbox id from one of from to to, persisted; rollback
	// puts back the record begin returned as prev.
	begin(ctx context.Context, teamID, id string, to State, from ...State) (sb, prev *Sandbox, err error)
	rollback(ctx context.Context, prev *Sandbox)
	// commit applies f to the live record of sandbox id and persists it.
	commit(ctx context.Context, id string, f func(*Sandbox)) (*Sandbox, error)
	// claimWarm hands a warm sandbox of template tplID to teamID (nil: the
	// pool cannot serve the request); discard ends one never handed out.
	claimWarm(tplID, teamID string, at time.Time, timeout time.Duration) *Sandbox
	discard(ctx context.Context, sb *Sandbox, why string) error
	// checkChosenID refuses a caller-chosen id that is malformed or taken.
	checkChosenID(id string) error
	// each calls f on every live record, one calls it on sandbox id's
	// (false: none), under the records' lock: f may change the record in
	// memory (the caller persists what must last), must not block and must
	// not call back into the manager; it may take a part's own lock
	// (idle, pools, samples), which comes after the records' lock.
	each(f func(sb *Sandbox))
	one(id string, f func(sb *Sandbox)) bool
	// all runs f under the records' lock with every live record, which f
	// may visit more than once (a count, then a choice by it).
	all(f func(live iter.Seq[*Sandbox]))
}
