package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/volume"
)

// fakeVolumes resolves volumes of one team by name or id and counts what
// is held.
type fakeVolumes struct {
	team string
	mu   sync.Mutex
	vols map[string]store.Volume // by name
	held map[string]int
}

func (f *fakeVolumes) Claim(ctx context.Context, teamID string, refs []string, byID bool) ([]volume.Mounted, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []volume.Mounted
	for _, ref := range refs {
		var v store.Volume
		ok := false
		for _, c := range f.vols {
			if (byID && c.ID == ref) || (!byID && c.Name == ref) {
				v, ok = c, true
			}
		}
		if !ok || teamID != f.team {
			return nil, nil, fmt.Errorf("volume %q not found: %w", ref, errdefs.ErrInvalidArgument)
		}
		out = append(out, volume.Mounted{Volume: v, HostPath: "/host/" + v.ID})
	}
	for _, m := range out {
		f.held[m.ID]++
	}
	return out, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range out {
			f.held[m.ID]--
		}
	}, nil
}

func (f *fakeVolumes) holding() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.held {
		n += c
	}
	return n
}

func TestVolumeMountsThroughThePipeline(t *testing.T) {
	e := newFakeEnv(t, LifecycleConfig{})
	ctx := context.Background()
	fv := &fakeVolumes{team: e.team, held: map[string]int{}, vols: map[string]store.Volume{
		"ws":   {ID: "vol-ws", TeamID: e.team, Name: "ws"},
		"data": {ID: "vol-data", TeamID: e.team, Name: "data"},
	}}
	req := e.req()
	req.VolumeMounts = []VolumeMount{{Name: "ws", Path: "/workspace"}}

	// Without volumes on the server a mount is refused, naming the field.
	if _, err := e.m.Create(ctx, req); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create with volumes on a server without them: %v", err)
	}
	e.m.start.vols = fv

	req.VolumeMounts = []VolumeMount{{Name: "ws", Path: "/workspace"}, {Name: "data", Path: "/data"}}
	sb := e.create(t, req)
	if want := []VolumeMount{{ID: "vol-ws", Name: "ws", Path: "/workspace"}, {ID: "vol-data", Name: "data", Path: "/data"}}; !slices.Equal(sb.VolumeMounts, want) {
		t.Fatalf("record's mounts %+v, want %+v", sb.VolumeMounts, want)
	}
	spec, _ := e.h.Runtime.Spec(sb.ID)
	if want := []runtime.VolumeMount{{Source: "/host/vol-ws", Path: "/workspace"}, {Source: "/host/vol-data", Path: "/data"}}; !slices.Equal(spec.Volumes, want) {
		t.Fatalf("runtime spec's volumes %+v, want %+v", spec.Volumes, want)
	}
	if n := fv.holding(); n != 0 {
		t.Fatalf("%d claims still held after the create", n)
	}
	if got := e.m.VolumeUsers(e.team, "vol-ws"); !slices.Equal(got, []string{sb.ID}) {
		t.Fatalf("users of vol-ws: %v", got)
	}
	if got := e.m.VolumeUsers("another-team", "vol-ws"); len(got) != 0 {
		t.Fatalf("another team's view of the users: %v", got)
	}
	// The mounts survive a restart (the record) and a pause.
	sb2, err := e.m.Get(ctx, e.team, sb.ID)
	if err != nil || len(sb2.VolumeMounts) != 2 {
		t.Fatalf("get: %+v %v", sb2, err)
	}

	// A missing volume fails the create in its resolve step and leaks nothing.
	bad := e.req()
	bad.VolumeMounts = []VolumeMount{{Name: "nope", Path: "/x"}}
	if _, err := e.m.Create(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("missing volume: %v", err)
	}
	if n := fv.holding(); n != 0 {
		t.Fatalf("%d claims held after a failed create", n)
	}

	// A snapshot and a fork mount the source's volumes, by id.
	snap, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, sb.ID, "withvols")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.VolumeMounts) != 2 {
		t.Fatalf("snapshot's mounts: %+v", snap.VolumeMounts)
	}
	fromSnap := e.req()
	fromSnap.Template = snap.ID
	restored := e.create(t, fromSnap)
	if !slices.Equal(restored.VolumeMounts, sb.VolumeMounts) {
		t.Fatalf("restored mounts %+v", restored.VolumeMounts)
	}
	if rs, _ := e.h.Runtime.Spec(restored.ID); len(rs.Volumes) != 2 || rs.Volumes[0].Source != "/host/vol-ws" {
		t.Fatalf("restored runtime volumes %+v", rs.Volumes)
	}
	fromSnap.VolumeMounts = []VolumeMount{{Name: "data", Path: "/other"}}
	if _, err := e.m.Create(ctx, fromSnap); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("volumeMounts with a snapshot: %v", err)
	}
	forks, err := e.m.Snapshots().Fork(ctx, e.team, sb.ID, 1, time.Minute)
	if err != nil || len(forks) != 1 || forks[0].Err != nil {
		t.Fatalf("fork: %+v %v", forks, err)
	}
	if !slices.Equal(forks[0].Sandbox.VolumeMounts, sb.VolumeMounts) {
		t.Fatalf("fork's mounts %+v", forks[0].Sandbox.VolumeMounts)
	}
	users := e.m.VolumeUsers(e.team, "vol-data")
	if len(users) != 3 {
		t.Fatalf("users of vol-data: %v", users)
	}
	// A volume gone since the snapshot: the restore says so.
	fv.mu.Lock()
	delete(fv.vols, "data")
	fv.mu.Unlock()
	fromSnap.VolumeMounts = nil
	if _, err := e.m.Create(ctx, fromSnap); err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("snapshot whose volume is gone: %v", err)
	}
	// Kills free the users.
	for _, id := range users {
		if err := e.m.Kill(ctx, e.team, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.m.VolumeUsers(e.team, "vol-ws"); len(got) != 0 {
		t.Fatalf("users after the kills: %v", got)
	}
	if n := fv.holding(); n != 0 {
		t.Fatalf("%d claims held at the end", n)
	}
}
