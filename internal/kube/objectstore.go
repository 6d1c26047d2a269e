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

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// A suspended Sandbox's image in the object store: recorded in an
// annotation (read by whichever agent restores it) and a condition.
const (
	AnnotationImage      = "agentbox.dev/image"
	ConditionImageStored = "ImageStored"
	ReasonImageStored    = "Stored"
	// ReasonImageUploadFailed: the image stays on its node only.
	ReasonImageUploadFailed = "UploadFailed"
	// ReasonImageIntegrity: the stored image failed authentication; nothing
	// was restored.
	ReasonImageIntegrity = "ImageIntegrityFailed"
	// ReasonImageRestoreFailed: the image could not be restored here.
	ReasonImageRestoreFailed = "ImageRestoreFailed"
	ReasonImageRestored      = "Restored"
	ReasonImageDropped       = "Resumed"
	// ReasonMoved: a Suspended Sandbox with a stored image was rebound
	// from its lost node to a live one.
	ReasonMoved = "Moved"
	// MetaRestoredFrom marks the sandbox restored from a stored image (its
	// prefix), so a retry after a lost status write does not restore twice.
	MetaRestoredFrom = "k8s.restored-from"
)

// Mover is what moving suspended sandboxes needs of the sandbox manager's
// snapshots (*sandbox.Snapshotter).
type Mover interface {
	ExportPaused(ctx context.Context, teamID, id, dir string) (*sandbox.MovedImage, error)
	ImportPaused(ctx context.Context, req sandbox.CreateRequest, fill func(dir string) (*sandbox.MovedImage, error)) (*sandbox.Sandbox, error)
}

// Images stores suspended Sandboxes' memory images in an object store, so
// another agent can resume them when their node is lost.
type Images struct {
	Store *objstore.Store
	Mover Mover
	// TempDir stages exports (private to the server).
	TempDir string
}

// storedImage is the JSON of AnnotationImage.
type storedImage struct {
	Node       string `json:"node"`
	SandboxID  string `json:"sandboxID"`
	Generation int64  `json:"generation"`
	Prefix     string `json:"prefix"`
}

func imageOf(obj *agentsv1.Sandbox) *storedImage {
	raw, ok := obj.Annotations[AnnotationImage]
	if !ok {
		return nil
	}
	var img storedImage
	if json.Unmarshal([]byte(raw), &img) != nil || !sandbox.ValidID(img.SandboxID) {
		return nil
	}
	// Anyone who may edit the Sandbox may edit its annotations: only the
	// Sandbox's own namespace's objects are ever read or deleted for it.
	if img.Prefix != objstore.ImagePrefix(obj.Namespace, img.SandboxID, img.Generation) {
		return nil
	}
	return &img
}

// binding ties a Sandbox's objects to its namespace (the tenant: it is
// bound to one team) and its uid, so no other Sandbox restores them.
func binding(obj *agentsv1.Sandbox) objstore.Binding {
	return objstore.Binding{Team: obj.Namespace, Sandbox: string(obj.UID)}
}

// setImage writes (or with img nil removes) the annotation. The metadata
// update returns the server's status; the status being made is kept.
func (b reconcilerBase) setImage(ctx context.Context, obj *agentsv1.Sandbox, img *storedImage) error {
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	if img == nil {
		if _, ok := obj.Annotations[AnnotationImage]; !ok {
			return nil
		}
		delete(obj.Annotations, AnnotationImage)
	} else {
		raw, err := json.Marshal(img)
		if err != nil {
			return err
		}
		obj.Annotations[AnnotationImage] = string(raw)
	}
	st := obj.Status.DeepCopy()
	err := b.c.Update(ctx, obj)
	obj.Status = *st
	return err
}

// storeImage uploads the image of the paused sandbox sb once per pause:
// the move-out steps (move.go).
func (r *sandboxReconciler) storeImage(ctx context.Context, team string, obj *agentsv1.Sandbox, sb *sandbox.Sandbox) (ctrl.Result, error) {
	im := r.cfg.Images
	if im == nil || sb.PausedFS {
		return ctrl.Result{}, nil
	}
	st, gen := &obj.Status, obj.Generation
	old := imageOf(obj)
	if old != nil && old.SandboxID == sb.ID && old.Node == r.cfg.Node {
		// Stored on an earlier pass (an agent that crashed right after
		// recording it had not written the condition yet).
		if !meta.IsStatusConditionTrue(st.Conditions, ConditionImageStored) {
			setCond(&st.Conditions, gen, ConditionImageStored, true, ReasonImageStored, storedMessage(old))
		}
		return ctrl.Result{}, nil
	}
	fail := func(err error) (ctrl.Result, error) {
		msg := "the image stays on node " + r.cfg.Node + " only: " + err.Error()
		setCond(&st.Conditions, gen, ConditionImageStored, false, ReasonImageUploadFailed, msg)
		r.event(obj, true, ReasonImageUploadFailed, "StoreImage", "%s", msg)
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	dir, err := os.MkdirTemp(im.TempDir, "export-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	run := &storeRun{team: team, obj: obj, sb: sb, dir: dir, old: old,
		img: &storedImage{Node: r.cfg.Node, SandboxID: sb.ID, Generation: gen, Prefix: objstore.ImagePrefix(obj.Namespace, sb.ID, gen)}}
	if err := r.runMove(ctx, sandbox.OpMoveOut, r.storeSteps(run)); err != nil {
		if run.unrecorded {
			return ctrl.Result{}, err
		}
		return fail(err)
	}
	msg := storedMessage(run.img)
	setCond(&st.Conditions, gen, ConditionImageStored, true, ReasonImageStored, msg)
	r.event(obj, false, ReasonImageStored, "StoreImage", "%s in %s", msg, time.Since(start).Round(time.Millisecond))
	return ctrl.Result{}, nil
}

func storedMessage(img *storedImage) string {
	return fmt.Sprintf("image of sandbox %s stored (sealed) under %s by node %s; any agent with the object store can resume it", img.SandboxID, img.Prefix, img.Node)
}

// storeRun is what the move-out steps of one Sandbox share.
type storeRun struct {
	team     string
	obj      *agentsv1.Sandbox
	sb       *sandbox.Sandbox
	dir      string // the staging dir
	rec      []byte // the sandbox manager's record of the image
	img, old *storedImage
	// unrecorded: the annotation write failed (the objects went with it);
	// the reconcile is retried at once rather than reported.
	unrecorded bool
}

// storeSteps are the move-out steps after the sandbox manager's export.
func (r *sandboxReconciler) storeSteps(s *storeRun) []moveStep {
	return []moveStep{
		{sandbox.MoveImageOut, func(ctx context.Context) error {
			moved, err := r.cfg.Images.Mover.ExportPaused(ctx, s.team, s.sb.ID, s.dir)
			if err != nil {
				return err
			}
			s.rec, err = json.Marshal(moved)
			return err
		}},
		{MoveUpload, func(ctx context.Context) error {
			return r.cfg.Images.Store.PutImage(ctx, s.img.Prefix, binding(s.obj), s.dir, objstore.Manifest{
				SandboxID: s.sb.ID, Node: r.cfg.Node, Generation: s.img.Generation, CreatedAt: time.Now().UTC(), Record: s.rec,
			})
		}},
		{MoveRecord, func(ctx context.Context) error {
			if err := r.setImage(ctx, s.obj, s.img); err != nil {
				// Not recorded: the objects are unreachable, so they go.
				_ = r.cfg.Images.Store.DeletePrefix(ctx, s.img.Prefix)
				s.unrecorded = true
				return err
			}
			return nil
		}},
		{MoveDropOlder, func(ctx context.Context) error {
			if s.old != nil && s.old.Prefix != s.img.Prefix {
				if err := r.cfg.Images.Store.DeletePrefix(ctx, s.old.Prefix); err != nil {
					r.log.Warn("delete an older stored image", "prefix", s.old.Prefix, "err", err)
				}
			}
			// And those of earlier passes that died before recording theirs.
			if err := r.sweepImages(ctx, s.obj, s.img.Prefix, s.sb.ID); err != nil {
				r.log.Warn("delete older stored images", "sandbox", s.sb.ID, "err", err)
			}
			return nil
		}},
	}
}

// dropImage deletes a Sandbox's stored images (resumed in place, or
// deleted) and its annotation: the recorded one and every other generation
// the bucket holds for its sandbox, as an agent that died between
// uploading an image and recording it left one that nothing names.
func (r *sandboxReconciler) dropImage(ctx context.Context, obj *agentsv1.Sandbox, reason, msg string) error {
	img := imageOf(obj)
	if img != nil {
		if err := r.dropStored(ctx, obj, img); err != nil {
			return err
		}
	}
	var err error
	if img == nil || img.SandboxID != obj.Status.SandboxID {
		err = r.sweepImages(ctx, obj, "", obj.Status.SandboxID)
	}
	if err != nil {
		if img != nil || mayHoldImage(obj) {
			return err
		}
		// A Sandbox never suspended has none: its delete does not wait
		// for the bucket.
		r.log.Warn("look for stored images of a Sandbox never suspended", "sandbox", obj.Namespace+"/"+obj.Name, "err", err)
	}
	if img == nil {
		return nil
	}
	return r.clearRecord(ctx, obj, reason, msg)
}

// mayHoldImage reports whether obj was ever asked to suspend, so an image
// of it may be stored.
func mayHoldImage(obj *agentsv1.Sandbox) bool {
	return obj.Spec.OperatingMode == agentsv1.OperatingModeSuspended ||
		meta.FindStatusCondition(obj.Status.Conditions, agentsv1.ConditionSuspended) != nil ||
		meta.FindStatusCondition(obj.Status.Conditions, ConditionImageStored) != nil
}

// dropStored deletes the objects of a Sandbox's stored image, and those
// of every other generation stored for its sandbox.
func (r *sandboxReconciler) dropStored(ctx context.Context, obj *agentsv1.Sandbox, img *storedImage) error {
	if r.cfg.Images == nil {
		// Not fatal: a delete must not wait for a flag this agent lacks.
		r.event(obj, true, ReasonImageRestoreFailed, "DeleteImage", "the image stored under %s stays in the bucket: this agent (node %s) has no --kube-object-store", img.Prefix, r.cfg.Node)
		return nil
	}
	if err := r.cfg.Images.Store.DeletePrefix(ctx, img.Prefix); err != nil {
		return fmt.Errorf("delete stored image %s: %w", img.Prefix, err)
	}
	return r.sweepImages(ctx, obj, "", img.SandboxID)
}

// sweepImages deletes every generation of obj's image stored under each
// of ids but keep ("" keeps none), recorded or not. Only objects sealed
// for obj (its namespace and uid) go, so an id a status names wrongly
// costs another Sandbox nothing.
func (r *sandboxReconciler) sweepImages(ctx context.Context, obj *agentsv1.Sandbox, keep string, ids ...string) error {
	if r.cfg.Images == nil {
		return nil
	}
	var errs []error
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || !sandbox.ValidID(id) {
			continue
		}
		seen[id] = true
		gone, err := r.cfg.Images.Store.SweepImages(ctx, obj.Namespace, id, binding(obj), keep)
		if err != nil {
			errs = append(errs, fmt.Errorf("delete stored images of sandbox %s: %w", id, err))
		}
		if len(gone) > 0 {
			r.log.Info("deleted stored images", "sandbox", obj.Namespace+"/"+obj.Name, "prefixes", gone)
		}
	}
	return errors.Join(errs...)
}

// clearRecord says why the image goes in the ImageStored condition, then
// removes its annotation (kept on a Sandbox being deleted). The status is
// written first: an agent that dies in between finds the annotation and
// does this again, while one that wrote only the annotation would leave
// the condition saying the image is stored.
func (r *sandboxReconciler) clearRecord(ctx context.Context, obj *agentsv1.Sandbox, reason, msg string) error {
	if !obj.DeletionTimestamp.IsZero() {
		return nil
	}
	if reason != "" {
		setCond(&obj.Status.Conditions, obj.Generation, ConditionImageStored, false, reason, msg)
		if err := r.c.Status().Update(ctx, obj); err != nil {
			return err
		}
	}
	return r.setImage(ctx, obj, nil)
}

// restoreMoved handles a Sandbox bound to this agent whose image another
// agent stored: kept suspended, or restored here (same sandbox id, a new
// address, memory and files as they were) when set Running: the move-in
// steps (move.go). done is false when the Sandbox has no such image.
func (r *sandboxReconciler) restoreMoved(ctx context.Context, team string, obj *agentsv1.Sandbox) (done bool, res ctrl.Result, err error) {
	img := imageOf(obj)
	if img == nil || img.Node == r.cfg.Node {
		return false, ctrl.Result{}, nil
	}
	st, gen := &obj.Status, obj.Generation
	st.PodIPs = nil
	// A restore whose status write was lost: the sandbox is here already.
	// Any other local sandbox of this Sandbox is a stale copy.
	run := &restoreRun{team: team, obj: obj, img: img}
	for _, sb := range r.sbs.List(ctx, team) {
		if sb.Metadata[MetaUID] != string(obj.UID) {
			continue
		}
		if sb.Metadata[MetaRestoredFrom] == img.Prefix {
			run.restored = sb
			continue
		}
		if !sb.State.Paused() {
			continue
		}
		if err := r.sbs.Kill(ctx, team, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return true, ctrl.Result{}, err
		}
	}
	if run.restored == nil && obj.Spec.OperatingMode == agentsv1.OperatingModeSuspended {
		setCond(&st.Conditions, gen, agentsv1.ConditionSuspended, true, agentsv1.ReasonPaused,
			fmt.Sprintf("suspended; its image (stored by node %s) is restored on node %s when set Running", img.Node, r.cfg.Node))
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonSuspended, "operatingMode is Suspended")
		return true, ctrl.Result{}, nil
	}
	if run.restored == nil && r.cfg.Images == nil {
		msg := fmt.Sprintf("its image is stored under %s by node %s, but this agent (node %s) has no --kube-object-store", img.Prefix, img.Node, r.cfg.Node)
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, ReasonImageRestoreFailed, msg)
		return true, ctrl.Result{}, nil
	}
	if err := r.runMove(ctx, sandbox.OpMoveIn, r.restoreSteps(run)); err != nil {
		if run.restored != nil {
			return true, ctrl.Result{}, err
		}
		reason := ReasonImageRestoreFailed
		if errors.Is(err, objstore.ErrIntegrity) {
			reason = ReasonImageIntegrity
		}
		msg := fmt.Sprintf("restore of the image stored by node %s under %s failed; nothing was restored: %v", img.Node, img.Prefix, err)
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, reason, msg)
		r.event(obj, true, reason, "RestoreImage", "%s", msg)
		return true, ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	res, err = r.converge(ctx, team, obj, run.restored)
	return true, res, err
}

// restoreRun is what the move-in steps of one Sandbox share.
type restoreRun struct {
	team     string
	obj      *agentsv1.Sandbox
	img      *storedImage
	restored *sandbox.Sandbox // found here, or restored by the restore step
}

// restoreSteps are the move-in steps around the sandbox manager's import.
func (r *sandboxReconciler) restoreSteps(s *restoreRun) []moveStep {
	return []moveStep{
		{MoveRestore, func(ctx context.Context) error {
			if s.restored != nil {
				return nil
			}
			sb, err := r.importMoved(ctx, s.team, s.obj, s.img)
			if err != nil {
				return err
			}
			s.restored = sb
			return nil
		}},
		{MoveDropImage, func(ctx context.Context) error {
			s.obj.Status.SandboxID = s.restored.ID
			return r.dropStored(ctx, s.obj, s.img)
		}},
		{MoveClearRecord, func(ctx context.Context) error {
			return r.clearRecord(ctx, s.obj, ReasonImageRestored, fmt.Sprintf("restored on node %s as sandbox %s; the stored image was deleted", r.cfg.Node, s.restored.ID))
		}},
	}
}

// importMoved restores the image another agent stored, under the sandbox's
// own id (and so its label, its envd token and every client's handle on
// it); only its address changes.
func (r *sandboxReconciler) importMoved(ctx context.Context, team string, obj *agentsv1.Sandbox, img *storedImage) (*sandbox.Sandbox, error) {
	im := r.cfg.Images
	start := time.Now()
	req := sandbox.CreateRequest{TeamID: team, ID: img.SandboxID, Timeout: r.timeout(obj), Metadata: map[string]string{
		MetaUID: string(obj.UID), MetaNamespace: obj.Namespace, MetaName: obj.Name, MetaRestoredFrom: img.Prefix,
	}}
	sb, err := im.Mover.ImportPaused(ctx, req, func(dir string) (*sandbox.MovedImage, error) {
		m, err := im.Store.GetImage(ctx, img.Prefix, binding(obj), dir)
		if err != nil {
			return nil, err
		}
		if m.SandboxID != img.SandboxID || m.Generation != img.Generation {
			return nil, fmt.Errorf("image under %s is of sandbox %s generation %d, want %s generation %d: %w", img.Prefix, m.SandboxID, m.Generation, img.SandboxID, img.Generation, objstore.ErrIntegrity)
		}
		var moved sandbox.MovedImage
		if err := json.Unmarshal(m.Record, &moved); err != nil {
			return nil, fmt.Errorf("image under %s: record: %w", img.Prefix, err)
		}
		return &moved, nil
	})
	if err != nil {
		return nil, err
	}
	r.event(obj, false, ReasonImageRestored, "RestoreImage", "sandbox %s restored on node %s from the image node %s stored, in %s",
		sb.ID, r.cfg.Node, img.Node, time.Since(start).Round(time.Millisecond))
	return sb, nil
}

// releaseElsewhere removes this agent's copy of a Sandbox now bound to
// another node (its suspended image was moved while this node was lost).
func (r *sandboxReconciler) releaseElsewhere(ctx context.Context, team string, obj *agentsv1.Sandbox) (ctrl.Result, error) {
	for _, sb := range r.sbs.List(ctx, team) {
		// Only suspended Sandboxes move, so a stale copy is a paused one.
		if sb.Metadata[MetaUID] != string(obj.UID) || !sb.State.Paused() {
			continue
		}
		if err := r.sbs.Kill(ctx, team, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return ctrl.Result{}, fmt.Errorf("remove local copy %s of a Sandbox bound to node %s: %w", sb.ID, obj.Status.NodeName, err)
		}
		r.event(obj, false, "Released", "Release", "local copy %s on node %s removed: the Sandbox is bound to node %s", sb.ID, r.cfg.Node, obj.Status.NodeName)
	}
	return ctrl.Result{}, nil
}

// moveStored rebinds a Sandbox of a lost node whose image that node stored
// to the live agent placement ranks first (only that agent writes; the
// write is guarded by the resourceVersion). It reports whether the Sandbox
// was handled (moved, or left to another agent to move).
func (b reconcilerBase) moveStored(ctx context.Context, obj *agentsv1.Sandbox, lost node) (bool, error) {
	img := imageOf(obj)
	if img == nil || img.Node != obj.Status.NodeName {
		return false, nil
	}
	// Marked NodeLost on an earlier pass first, so the loss is on record.
	if c := meta.FindStatusCondition(obj.Status.Conditions, agentsv1.ConditionReady); c == nil || c.Reason != ReasonNodeLost {
		return false, nil
	}
	best, _, ok, err := b.placement(ctx, obj)
	if err != nil || !ok {
		return false, err
	}
	if best != b.cfg.Node {
		return true, nil
	}
	msg := fmt.Sprintf("node %s is lost (Lease not renewed since %s); the Sandbox's image is in the object store, so it moved from node %s to node %s",
		lost.Node, lost.renewed.UTC().Format(time.RFC3339), lost.Node, best)
	obj.Status.NodeName = best
	setCond(&obj.Status.Conditions, obj.Generation, agentsv1.ConditionReady, false, ReasonMoved, msg)
	// One step, on the controller side: the new node's agent restores the
	// image (move-in) once the Sandbox is set Running.
	err = b.runMove(ctx, OpMove, []moveStep{{MoveRebind, func(ctx context.Context) error {
		if err := b.c.Status().Update(ctx, obj); err != nil {
			return err
		}
		b.event(obj, true, ReasonMoved, "Move", "%s", msg)
		return nil
	}}})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return true, nil // changed meanwhile: the next pass looks again
	}
	return true, err
}
