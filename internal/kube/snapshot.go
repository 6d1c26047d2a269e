package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/agentbox/agentbox/internal/errdefs"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// AnnotationSnapshot on a Sandbox names the SandboxSnapshot of its own
// namespace it starts from (its image and template are the snapshot's).
const AnnotationSnapshot = "agentbox.dev/snapshot"

// Reasons a Sandbox made from a snapshot reports.
const (
	ReasonSnapshotNotFound    = "SnapshotNotFound"
	ReasonSnapshotNotReady    = "SnapshotNotReady"
	ReasonSnapshotUnavailable = "SnapshotUnavailable"
)

// Snapshotter is what SandboxSnapshots need of the sandbox manager's
// snapshots (*sandbox.Snapshotter).
type Snapshotter interface {
	CreateSnapshot(ctx context.Context, teamID, id, name string) (*sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, teamID, sandboxID, name string) []*sandbox.Snapshot
	DeleteSnapshot(ctx context.Context, teamID, ref string) error
	ExportSnapshot(ctx context.Context, teamID, ref, dir string) (*sandbox.MovedImage, error)
	ImportPaused(ctx context.Context, req sandbox.CreateRequest, fill func(dir string) (*sandbox.MovedImage, error)) (*sandbox.Sandbox, error)
}

// SnapshotPrefix is where a SandboxSnapshot's sealed image lives. Its last
// segment is not a number, so it never names a suspended Sandbox's image
// (<namespace>/<sandbox id>/<generation>/).
func SnapshotPrefix(namespace, name string) string {
	return fmt.Sprintf("%s/%s/snapshot/", namespace, name)
}

// localSnapshotName is the name of a SandboxSnapshot's snapshot on its
// node: a retry after a lost status write finds it instead of taking a
// second one.
func localSnapshotName(snap *abv1.SandboxSnapshot) string { return "k8s-" + string(snap.UID) }

// snapshotBinding ties the objects to the namespace (the team) and the
// SandboxSnapshot's uid: no other object of any namespace restores them.
func snapshotBinding(snap *abv1.SandboxSnapshot) objstore.Binding {
	return objstore.Binding{Team: snap.Namespace, Sandbox: string(snap.UID)}
}

// storedAt is where the snapshot's image is stored ("" = not stored).
// Anyone who may write the object's status may write its location: only
// the snapshot's own prefix is ever read or deleted for it.
func storedAt(snap *abv1.SandboxSnapshot) string {
	if l := snap.Status.Location; l != "" && l == SnapshotPrefix(snap.Namespace, snap.Name) {
		return l
	}
	return ""
}

type snapshotReconciler struct{ reconcilerBase }

// Reconcile takes a SandboxSnapshot on the node of its Sandbox, uploads it
// to the object store, and on delete removes both copies.
func (r *snapshotReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var snap abv1.SandboxSnapshot
	if err := r.c.Get(ctx, req.NamespacedName, &snap); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	bnd, bound := r.teams.team(snap.Namespace)
	team := bnd.id
	if !bound || r.cfg.Node == "" {
		return ctrl.Result{}, nil
	}
	ss := r.cfg.Snapshots
	if ss == nil {
		return ctrl.Result{}, nil
	}
	st := &snap.Status
	if !snap.DeletionTimestamp.IsZero() {
		if !controllerutil.ContainsFinalizer(&snap, abv1.Finalizer) {
			return ctrl.Result{}, nil
		}
		if st.NodeName != r.cfg.Node {
			if st.NodeName != "" {
				return ctrl.Result{}, nil // its node deletes its copy
			}
			// Never taken: the source's node removes the finalizer (or
			// anyone, once the source is gone; a copy its node took before
			// crashing goes with that node's sweep, snapshotsweep.go). Asked
			// of the API server, and asked again: no event of the source
			// re-queues this object.
			var src agentsv1.Sandbox
			err := r.api.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.SandboxRef.Name}, &src)
			if err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			if err == nil && src.Status.NodeName != "" && src.Status.NodeName != r.cfg.Node {
				return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
			}
		}
		// Its own prefix, recorded or not (an agent that died between the
		// upload and recording it left objects no status names); only
		// objects sealed for this object's uid go.
		if r.cfg.Images == nil {
			if at := storedAt(&snap); at != "" {
				r.event(&snap, true, ReasonImageRestoreFailed, "DeleteImage", "the image stored under %s stays in the bucket: this agent (node %s) has no --kube-object-store", at, r.cfg.Node)
			}
		} else if _, err := r.cfg.Images.Store.DeleteOwned(ctx, SnapshotPrefix(snap.Namespace, snap.Name), snapshotBinding(&snap)); err != nil {
			return ctrl.Result{}, fmt.Errorf("delete stored snapshot %s: %w", SnapshotPrefix(snap.Namespace, snap.Name), err)
		}
		// The local copy by its name, recorded or not (taken by an agent
		// that died before writing the status).
		for _, s := range ss.ListSnapshots(ctx, team, "", localSnapshotName(&snap)) {
			if err := ss.DeleteSnapshot(ctx, team, s.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return ctrl.Result{}, fmt.Errorf("delete local snapshot %s: %w", s.ID, err)
			}
		}
		return ctrl.Result{}, r.removeFinalizer(ctx, &snap, abv1.Finalizer)
	}
	if st.Phase == abv1.PhaseFailed || (st.NodeName != "" && st.NodeName != r.cfg.Node) {
		return ctrl.Result{}, nil
	}
	run := &snapshotRun{team: team, teamName: bnd.name, ss: ss, snap: &snap, written: st.DeepCopy()}
	res, err := r.take(ctx, run)
	if err == nil {
		err = r.writeStatus(ctx, run)
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// Read from a stale cache: the next reconcile sees the newer
		// object (a snapshot taken meanwhile is found by its name).
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return res, err
}

func snapshotStatusEqual(a, b *abv1.SandboxSnapshotStatus) bool {
	return a.Phase == b.Phase && a.SnapshotID == b.SnapshotID && a.Team == b.Team && a.SandboxID == b.SandboxID && a.Template == b.Template &&
		a.NodeName == b.NodeName && a.SizeBytes == b.SizeBytes && a.Location == b.Location &&
		a.ObservedGeneration == b.ObservedGeneration && conditionsEqual(a.Conditions, b.Conditions)
}

// take snapshots the source Sandbox when it runs on this node, then stores
// the image (when the agents have an object store): the snapshot-store
// steps (snapshotsteps.go).
func (r *snapshotReconciler) take(ctx context.Context, s *snapshotRun) (ctrl.Result, error) {
	snap := s.snap
	st, gen := &snap.Status, snap.Generation
	fail := func(reason, msg string) (ctrl.Result, error) {
		st.Phase = abv1.PhaseFailed
		setCond(&st.Conditions, gen, abv1.ConditionReady, false, reason, msg)
		r.event(snap, true, reason, "Snapshot", "%s", msg)
		return ctrl.Result{}, nil
	}
	if st.SnapshotID == "" {
		// Taken on a pass whose status write was lost (a crash): it is
		// recorded whatever became of its source.
		if got := s.ss.ListSnapshots(ctx, s.team, "", localSnapshotName(snap)); len(got) > 0 {
			s.local = got[0]
		}
	}
	if st.SnapshotID == "" && s.local == nil {
		var src agentsv1.Sandbox
		key := client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.SandboxRef.Name}
		if err := r.api.Get(ctx, key, &src); err != nil {
			if apierrors.IsNotFound(err) {
				return fail(abv1.ReasonSourceNotFound, fmt.Sprintf("spec.sandboxRef.name: no Sandbox %s in namespace %s", key.Name, key.Namespace))
			}
			return ctrl.Result{}, err
		}
		if src.Status.NodeName != r.cfg.Node {
			return ctrl.Result{RequeueAfter: 2 * time.Second}, nil // its node's agent takes it
		}
		if !meta.IsStatusConditionTrue(src.Status.Conditions, agentsv1.ConditionReady) || src.Status.SandboxID == "" {
			if meta.IsStatusConditionTrue(src.Status.Conditions, agentsv1.ConditionSuspended) {
				return fail(abv1.ReasonSourceNotReady, fmt.Sprintf("Sandbox %s is suspended: snapshots are taken of running Sandboxes (set operatingMode Running, then make a new SandboxSnapshot)", src.Name))
			}
			st.Phase = abv1.PhasePending
			setCond(&st.Conditions, gen, abv1.ConditionReady, false, abv1.ReasonSourceNotReady, "waiting for Sandbox "+src.Name+" to be Ready")
			return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
		}
		s.src = src.Status.SandboxID
	}
	if st.SnapshotID != "" && !r.storing(s) {
		return ctrl.Result{}, nil
	}
	defer func() {
		if s.dir != "" {
			_ = os.RemoveAll(s.dir)
		}
	}()
	if err := r.runMove(ctx, OpSnapshotStore, r.storeSnapshotSteps(s)); err != nil && !errors.Is(err, errReported) {
		return ctrl.Result{}, err
	}
	return s.res, nil
}

// sourceSnapshot reads the Ready SandboxSnapshot a Sandbox starts from.
// Only the Sandbox's own namespace is looked in, and only the snapshots of
// the team the namespace is bound to count.
func (b reconcilerBase) sourceSnapshot(ctx context.Context, obj *agentsv1.Sandbox) (*abv1.SandboxSnapshot, string, error) {
	name := obj.Annotations[AnnotationSnapshot]
	var snap abv1.SandboxSnapshot
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: name}, &snap); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, ReasonSnapshotNotFound, fmt.Errorf("metadata.annotations[%s]: no SandboxSnapshot %s in namespace %s", AnnotationSnapshot, name, obj.Namespace)
		}
		return nil, agentsv1.ReasonReconcilerError, err
	}
	if t := SnapshotTeam(&snap); t != "" {
		// Another team's snapshot is as unknown as a missing one.
		if bnd, ok := b.teams.team(obj.Namespace); !ok || bnd.name != t {
			return nil, ReasonSnapshotNotFound, fmt.Errorf("metadata.annotations[%s]: no SandboxSnapshot %s of this namespace's team in namespace %s", AnnotationSnapshot, name, obj.Namespace)
		}
	}
	if !snap.DeletionTimestamp.IsZero() || snap.Status.Phase != abv1.PhaseReady || snap.Status.SnapshotID == "" {
		return &snap, ReasonSnapshotNotReady, fmt.Errorf("metadata.annotations[%s]: SandboxSnapshot %s is not Ready (phase %q)", AnnotationSnapshot, name, snap.Status.Phase)
	}
	return &snap, "", nil
}

// fromSnapshot starts the Sandbox's sandbox from its SandboxSnapshot: on
// the snapshot's node from the local copy, elsewhere from the sealed image
// in the object store (downloaded, verified, then restored). It returns
// nil with a condition set when it cannot (yet).
func (r *sandboxReconciler) fromSnapshot(ctx context.Context, team string, obj *agentsv1.Sandbox, req sandbox.CreateRequest) (*sandbox.Sandbox, ctrl.Result, error) {
	st, gen := &obj.Status, obj.Generation
	refuse := func(reason string, err error, retry time.Duration) (*sandbox.Sandbox, ctrl.Result, error) {
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, reason, err.Error())
		r.event(obj, true, reason, "Create", "%v", err)
		return nil, ctrl.Result{RequeueAfter: retry}, nil
	}
	// Not retried: the stored image failed authentication, and each try
	// downloads all of it again. Read past the cache, which may not hold
	// the failure yet when a queued event reconciles again at once.
	var cur agentsv1.Sandbox
	if err := r.api.Get(ctx, client.ObjectKeyFromObject(obj), &cur); err != nil {
		return nil, ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cur.DeletionTimestamp.IsZero() {
		return nil, ctrl.Result{}, nil
	}
	if c := meta.FindStatusCondition(cur.Status.Conditions, agentsv1.ConditionReady); c != nil && c.Reason == ReasonImageIntegrity && c.ObservedGeneration == gen {
		return nil, ctrl.Result{}, nil
	}
	ss := r.cfg.Snapshots
	if ss == nil {
		return refuse(ReasonSnapshotUnavailable, errors.New("this agent cannot start sandboxes from snapshots"), 0)
	}
	snap, reason, err := r.sourceSnapshot(ctx, obj)
	if err != nil {
		return refuse(reason, err, 5*time.Second)
	}
	var fill func(dir string) (*sandbox.MovedImage, error)
	from := ""
	switch {
	case snap.Status.NodeName == r.cfg.Node:
		from = "its local copy"
		fill = func(dir string) (*sandbox.MovedImage, error) {
			return ss.ExportSnapshot(ctx, team, snap.Status.SnapshotID, dir)
		}
	case storedAt(snap) != "" && r.cfg.Images != nil:
		at := storedAt(snap)
		from = "the object store (" + at + ")"
		fill = func(dir string) (*sandbox.MovedImage, error) {
			m, err := r.cfg.Images.Store.GetImage(ctx, at, snapshotBinding(snap), dir)
			if err != nil {
				return nil, err
			}
			if m.SandboxID != snap.Status.SandboxID {
				return nil, fmt.Errorf("image under %s is of sandbox %s, want %s: %w", at, m.SandboxID, snap.Status.SandboxID, objstore.ErrIntegrity)
			}
			var moved sandbox.MovedImage
			if err := json.Unmarshal(m.Record, &moved); err != nil {
				return nil, fmt.Errorf("image under %s: record: %w", at, err)
			}
			return &moved, nil
		}
	default:
		return refuse(ReasonSnapshotUnavailable, fmt.Errorf("SandboxSnapshot %s is kept on node %s only and this agent (node %s) cannot fetch it: give every agent --kube-object-store", snap.Name, snap.Status.NodeName, r.cfg.Node), time.Minute)
	}
	setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonDependenciesNotReady, "starting the sandbox from SandboxSnapshot "+snap.Name)
	start := time.Now()
	run := &snapshotRestoreRun{obj: obj, team: team, start: func(ctx context.Context) (*sandbox.Sandbox, error) {
		return ss.ImportPaused(ctx, req, fill)
	}}
	if err := r.runMove(ctx, OpSnapshotRestore, r.restoreSnapshotSteps(run)); err != nil {
		if run.sb != nil {
			// Started; only its record failed: the next pass finds it by uid.
			return nil, ctrl.Result{}, err
		}
		reason := ReasonImageRestoreFailed
		if errors.Is(err, objstore.ErrIntegrity) {
			reason = ReasonImageIntegrity
		}
		retry := time.Minute
		if reason == ReasonImageIntegrity {
			retry = 0
		}
		return refuse(reason, fmt.Errorf("start from SandboxSnapshot %s (from %s) failed; nothing was restored: %w", snap.Name, from, err), retry)
	}
	sb := run.sb
	r.event(obj, false, "Created", "Create", "sandbox %s started on node %s from SandboxSnapshot %s (from %s) in %s", sb.ID, r.cfg.Node, snap.Name, from, time.Since(start).Round(time.Millisecond))
	return sb, ctrl.Result{}, nil
}

// snapshotNode is the only node a Sandbox made from a snapshot may go to
// when the snapshot is not in the object store ("" = any node).
func (b reconcilerBase) snapshotNode(ctx context.Context, obj *agentsv1.Sandbox) string {
	if obj.Annotations[AnnotationSnapshot] == "" {
		return ""
	}
	snap, _, err := b.sourceSnapshot(ctx, obj)
	if err != nil || storedAt(snap) != "" {
		return ""
	}
	return snap.Status.NodeName
}

// The server's sandbox manager takes, stores and restores snapshots.
var _ Snapshotter = (*sandbox.Snapshotter)(nil)
