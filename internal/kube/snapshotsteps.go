package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Storing a SandboxSnapshot and starting a Sandbox from one are ordered
// lists of named steps run like a move's (runMove, move.go), so the same
// crash switch kills the agent right after any of them; each step is
// idempotent and the next pass (of this agent, restarted) finishes the list:
//
//	op                agent               steps
//	snapshot-store    the source's node   finalizer, take (the sandbox manager's "snapshot/<step>"
//	                                      inside), record, export, upload, record stored
//	snapshot-restore  the Sandbox's node  import (the manager's move-in steps and "restore/<step>"
//	                                      inside), record
//
// e2e/kube's TestKubeSnapshotCrash crashes an agent after every one.
const (
	OpSnapshotStore = "snapshot-store"
	// snapshot-store: the finalizer holds the object until its copies
	// are deleted, so a delete from here on finds them.
	SnapshotFinalizer = "finalizer"
	// snapshot-store: the sandbox manager's snapshot exists under the
	// object's uid (localSnapshotName): a retry finds it, never takes two.
	SnapshotTake = "take"
	// snapshot-store: status says Ready (Taken) with its node and team.
	SnapshotRecord = "record"
	// snapshot-store: the image is staged under the data dir's kube-export
	// dir (emptied when the agent starts).
	SnapshotExport = "export"
	// snapshot-store: the sealed image is under SnapshotPrefix; a retry
	// overwrites it, a delete finds it there, recorded or not.
	SnapshotUpload = "upload"
	// snapshot-store: status.location names the prefix (Ready, Stored).
	SnapshotRecordStored = "record stored"

	OpSnapshotRestore = "snapshot-restore"
	// snapshot-restore: the sandbox runs here, marked with the Sandbox's
	// uid, so a retry finds it instead of restoring twice.
	SnapshotImport = "import"
	// snapshot-restore: status.sandboxID names it.
	SnapshotRecordSandbox = "record"
)

// errReported stops a step list whose failure a step already put in the
// status.
var errReported = errors.New("reported in the status")

// snapshotRun is what the snapshot-store steps of one SandboxSnapshot share.
type snapshotRun struct {
	team     string // the sandbox manager's team id
	teamName string // the namespace's team, recorded as status.team
	ss       Snapshotter
	snap     *abv1.SandboxSnapshot
	// src is the source Sandbox's sandbox id (empty once taken).
	src string
	// local is the snapshot taken or found on this pass (nil: recorded
	// on an earlier one).
	local *sandbox.Snapshot
	// written is the status last written (or read): a step writes only
	// what changed.
	written *abv1.SandboxSnapshotStatus
	dir     string    // the export's staging dir
	rec     []byte    // the sandbox manager's record of the image
	start   time.Time // of the export, for the Stored event
	res     ctrl.Result
}

// writeStatus writes the SandboxSnapshot's status when it changed.
func (r *snapshotReconciler) writeStatus(ctx context.Context, s *snapshotRun) error {
	st := &s.snap.Status
	if st.SnapshotID != "" && st.Team == "" && s.teamName != "" {
		// The team that took it (one taken before snapshots recorded
		// their team gets its namespace's): it keeps the snapshot, and
		// the namespace, whatever the namespace's label says later.
		st.Team = s.teamName
	}
	st.ObservedGeneration = s.snap.Generation
	if snapshotStatusEqual(s.written, st) {
		return nil
	}
	if err := r.c.Status().Update(ctx, s.snap); err != nil {
		return err
	}
	s.written = st.DeepCopy()
	return nil
}

// storing reports whether the store steps after the record have work.
func (r *snapshotReconciler) storing(s *snapshotRun) bool {
	return s.snap.Status.Location == "" && r.cfg.Images != nil
}

// uploadFailed leaves the snapshot usable on its node, retried in a minute.
func (r *snapshotReconciler) uploadFailed(s *snapshotRun, err error) error {
	st := &s.snap.Status
	msg := fmt.Sprintf("snapshot %s is kept on node %s only; the upload failed: %v", st.SnapshotID, r.cfg.Node, err)
	setCond(&st.Conditions, s.snap.Generation, abv1.ConditionReady, true, abv1.ReasonUploadFailed, msg)
	r.event(s.snap, true, abv1.ReasonUploadFailed, "StoreImage", "%s", msg)
	s.res = ctrl.Result{RequeueAfter: time.Minute}
	return errReported
}

// storeSnapshotSteps are the snapshot-store steps.
func (r *snapshotReconciler) storeSnapshotSteps(s *snapshotRun) []moveStep {
	return []moveStep{
		{SnapshotFinalizer, func(ctx context.Context) error {
			return r.addFinalizer(ctx, s.snap, abv1.Finalizer)
		}},
		{SnapshotTake, func(ctx context.Context) error {
			if s.local != nil || s.snap.Status.SnapshotID != "" {
				return nil
			}
			start := time.Now()
			taken, err := s.ss.CreateSnapshot(ctx, s.team, s.src, localSnapshotName(s.snap))
			if err != nil {
				// Not retried: each try freezes the sandbox again. Make a
				// new SandboxSnapshot to try again.
				st := &s.snap.Status
				st.Phase = abv1.PhaseFailed
				msg := fmt.Sprintf("snapshot of sandbox %s on node %s: %v", s.src, r.cfg.Node, err)
				setCond(&st.Conditions, s.snap.Generation, abv1.ConditionReady, false, abv1.ReasonFailed, msg)
				r.event(s.snap, true, abv1.ReasonFailed, "Snapshot", "%s", msg)
				return errReported
			}
			r.event(s.snap, false, abv1.ReasonTaken, "Snapshot", "snapshot %s of sandbox %s taken on node %s in %s", taken.ID, s.src, r.cfg.Node, time.Since(start).Round(time.Millisecond))
			s.local = taken
			return nil
		}},
		{SnapshotRecord, func(ctx context.Context) error {
			local, st := s.local, &s.snap.Status
			if local == nil {
				return nil
			}
			st.SnapshotID, st.SandboxID, st.NodeName, st.SizeBytes = local.ID, local.SandboxID, r.cfg.Node, local.SizeBytes
			st.Template = local.Alias
			if st.Template == "" {
				st.Template = local.TemplateID
			}
			st.Phase = abv1.PhaseReady
			setCond(&st.Conditions, s.snap.Generation, abv1.ConditionReady, true, abv1.ReasonTaken, "snapshot "+local.ID+" kept on node "+r.cfg.Node+" only")
			return r.writeStatus(ctx, s)
		}},
		{SnapshotExport, func(ctx context.Context) error {
			if !r.storing(s) {
				return nil
			}
			dir, err := os.MkdirTemp(r.cfg.Images.TempDir, "snapshot-")
			if err != nil {
				return r.uploadFailed(s, err)
			}
			s.dir, s.start = dir, time.Now()
			moved, err := s.ss.ExportSnapshot(ctx, s.team, s.snap.Status.SnapshotID, dir)
			if err != nil {
				return r.uploadFailed(s, err)
			}
			if s.rec, err = json.Marshal(moved); err != nil {
				return r.uploadFailed(s, err)
			}
			return nil
		}},
		{SnapshotUpload, func(ctx context.Context) error {
			if !r.storing(s) {
				return nil
			}
			st := &s.snap.Status
			if err := r.cfg.Images.Store.PutImage(ctx, SnapshotPrefix(s.snap.Namespace, s.snap.Name), snapshotBinding(s.snap), s.dir, objstore.Manifest{
				SandboxID: st.SandboxID, Node: r.cfg.Node, CreatedAt: time.Now().UTC(), Record: s.rec,
			}); err != nil {
				return r.uploadFailed(s, err)
			}
			return nil
		}},
		{SnapshotRecordStored, func(ctx context.Context) error {
			if !r.storing(s) {
				return nil
			}
			st := &s.snap.Status
			prefix := SnapshotPrefix(s.snap.Namespace, s.snap.Name)
			st.Location = prefix
			msg := fmt.Sprintf("snapshot %s stored (sealed) under %s by node %s; any agent with the object store starts sandboxes from it", st.SnapshotID, prefix, r.cfg.Node)
			setCond(&st.Conditions, s.snap.Generation, abv1.ConditionReady, true, abv1.ReasonStored, msg)
			if err := r.writeStatus(ctx, s); err != nil {
				return err
			}
			r.event(s.snap, false, abv1.ReasonStored, "StoreImage", "%s in %s", msg, time.Since(s.start).Round(time.Millisecond))
			return nil
		}},
	}
}

// snapshotRestoreRun is what the snapshot-restore steps of one Sandbox share.
type snapshotRestoreRun struct {
	obj   *agentsv1.Sandbox
	team  string
	start func(ctx context.Context) (*sandbox.Sandbox, error)
	sb    *sandbox.Sandbox
}

// restoreSnapshotSteps are the snapshot-restore steps.
func (r *sandboxReconciler) restoreSnapshotSteps(s *snapshotRestoreRun) []moveStep {
	return []moveStep{
		{SnapshotImport, func(ctx context.Context) error {
			sb, err := s.start(ctx)
			s.sb = sb
			return err
		}},
		{SnapshotRecordSandbox, func(ctx context.Context) error {
			// Before anything else is written: a crash from here on finds
			// the sandbox by its id, not only by the uid it carries.
			s.obj.Status.SandboxID, s.obj.Status.Team = s.sb.ID, s.team
			return r.c.Status().Update(ctx, s.obj)
		}},
	}
}

// SnapshotCrashSteps lists every crash point of storing a SandboxSnapshot
// (store) and of starting a Sandbox from one (restore: from the object
// store on another node, or from the local copy on the snapshot's node),
// in the order they are reached: the sandbox manager's and the agents' own.
func SnapshotCrashSteps() (store, restore []sandbox.CrashStep) {
	var r snapshotReconciler
	var sr sandboxReconciler
	add := func(out []sandbox.CrashStep, op string, steps []string) []sandbox.CrashStep {
		for _, s := range steps {
			out = append(out, sandbox.CrashStep{Op: op, Step: s})
		}
		return out
	}
	steps := stepNames(r.storeSnapshotSteps(&snapshotRun{}))
	store = add(store, OpSnapshotStore, steps[:1])
	// The take runs the manager's snapshot steps.
	store = add(store, "snapshot", []string{sandbox.SnapshotPersisted, sandbox.SnapshotCaptured, sandbox.SnapshotPublished, sandbox.SnapshotCommitted})
	store = add(store, OpSnapshotStore, steps[1:])
	restore = sandbox.MoveInSteps()
	restore = add(restore, OpSnapshotRestore, stepNames(sr.restoreSnapshotSteps(&snapshotRestoreRun{})))
	return store, restore
}
