package kube

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// sweepSnaps is a node's snapshots; it records the deletes.
type sweepSnaps struct {
	Snapshotter
	snaps   []*sandbox.Snapshot
	deleted []string
}

func (f *sweepSnaps) ListSnapshots(_ context.Context, teamID, _, _ string) []*sandbox.Snapshot {
	var out []*sandbox.Snapshot
	for _, s := range f.snaps {
		if s.TeamID == teamID {
			out = append(out, s)
		}
	}
	return out
}

func (f *sweepSnaps) DeleteSnapshot(_ context.Context, _, ref string) error {
	f.deleted = append(f.deleted, ref)
	return nil
}

// TestSnapshotSweep: a node's copy of a SandboxSnapshot goes only when the
// API server holds no object of its uid; the copies of existing objects,
// the team's own snapshots, and everything when the API server cannot be
// asked stay.
func TestSnapshotSweep(t *testing.T) {
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "team-a"
	kept := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept", UID: types.UID("uid-kept")}}
	other := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "other", UID: types.UID("uid-other")}}
	snaps := func() []*sandbox.Snapshot {
		return []*sandbox.Snapshot{
			{ID: "s-kept", Name: localSnapshotName(kept), TeamID: "team"},
			{ID: "s-other", Name: localSnapshotName(other), TeamID: "team"},
			{ID: "s-gone", Name: "k8s-uid-gone", TeamID: "team"},
			{ID: "s-user", Name: "mine", TeamID: "team"},
			{ID: "s-unbound", Name: "k8s-uid-unbound", TeamID: "another-team"},
		}
	}
	for _, tc := range []struct {
		name    string
		listErr error
		want    []string
		wantErr bool
	}{
		{name: "only the copy of a deleted object goes", want: []string{"s-gone"}},
		{name: "an API error keeps every copy", listErr: errors.New("connection refused"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := fake.NewClientBuilder().WithScheme(scheme).WithObjects(kept, other).Build()
			api := interceptor.NewClient(server.(client.WithWatch), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if tc.listErr != nil {
						return tc.listErr
					}
					return c.List(ctx, list, opts...)
				},
			})
			ss := &sweepSnaps{snaps: snaps()}
			cfg := Config{Teams: map[string]string{ns: "team"}, Node: "node-a", Snapshots: ss}
			s := &snapshotSweep{reconcilerBase{c: server, api: api, cfg: cfg, teams: newBindings(cfg), log: slog.New(slog.DiscardHandler)}}
			n, err := s.sweep(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("sweep: %v, want error %v", err, tc.wantErr)
			}
			slices.Sort(ss.deleted)
			if !slices.Equal(ss.deleted, tc.want) || n != len(tc.want) {
				t.Errorf("deleted %v (%d), want %v", ss.deleted, n, tc.want)
			}
		})
	}
}
