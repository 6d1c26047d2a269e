package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/agentbox/agentbox/internal/errdefs"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
)

// snapshotSweepEvery is how often an agent looks again for local snapshot
// copies whose SandboxSnapshot is gone (a namespace bound by label after
// the start is only seen then).
const snapshotSweepEvery = 10 * time.Minute

// snapshotSweep removes the local copies of SandboxSnapshots that no longer
// exist. A SandboxSnapshot whose take crashed before its node was recorded
// may lose its finalizer to another agent once its source is gone; the
// copy's node never sees the object again, so it looks for the object
// itself: at start, then every snapshotSweepEvery.
type snapshotSweep struct{ reconcilerBase }

// NeedLeaderElection is false: every node agent sweeps its own copies.
func (s *snapshotSweep) NeedLeaderElection() bool { return false }

// Start sweeps until ctx ends.
func (s *snapshotSweep) Start(ctx context.Context) error {
	t := time.NewTicker(snapshotSweepEvery)
	defer t.Stop()
	for {
		if n, err := s.sweep(ctx); err != nil {
			s.log.Warn("kube: sweep of local snapshot copies skipped", "node", s.cfg.Node, "err", err)
		} else if n > 0 {
			s.log.Info("kube: removed local snapshot copies of deleted SandboxSnapshots", "node", s.cfg.Node, "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sweep deletes every local copy named for a SandboxSnapshot uid the API
// server does not hold, and returns how many went. The local copies are
// listed before the objects: a copy is only taken for an object that
// already exists, so a copy listed first is of an object the list holds
// unless that object was deleted. The API server is asked directly, never
// the cache, and any error leaves every copy in place.
func (s *snapshotSweep) sweep(ctx context.Context) (int, error) {
	ss := s.cfg.Snapshots
	if ss == nil {
		return 0, nil
	}
	type copyOf struct{ team, id string }
	local := map[types.UID][]copyOf{}
	seen := map[string]bool{}
	for _, ns := range s.teams.namespaces() {
		bnd, ok := s.teams.team(ns)
		if !ok || seen[bnd.id] {
			continue
		}
		seen[bnd.id] = true
		for _, snap := range ss.ListSnapshots(ctx, bnd.id, "", "") {
			if uid, ok := strings.CutPrefix(snap.Name, localSnapshotName(&abv1.SandboxSnapshot{})); ok && uid != "" {
				local[types.UID(uid)] = append(local[types.UID(uid)], copyOf{bnd.id, snap.ID})
			}
		}
	}
	if len(local) == 0 {
		return 0, nil
	}
	var list abv1.SandboxSnapshotList
	if err := s.api.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("list SandboxSnapshots: %w", err)
	}
	for i := range list.Items {
		delete(local, list.Items[i].UID)
	}
	n := 0
	var errs []error
	for uid, copies := range local {
		for _, c := range copies {
			if err := ss.DeleteSnapshot(ctx, c.team, c.id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				errs = append(errs, fmt.Errorf("delete local snapshot %s (SandboxSnapshot uid %s): %w", c.id, uid, err))
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}
