package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type reconcilerBase struct {
	c client.Client
	// api reads past the cache, where its lag would do harm.
	api  client.Reader
	rec  recorder.EventRecorder
	sbs  Sandboxes
	host Host
	cfg  Config
	log  *slog.Logger
	// teams are the bound namespaces (bindings.go).
	teams *bindings
}

func (b reconcilerBase) event(obj client.Object, warn bool, reason, action, format string, args ...any) {
	t := corev1.EventTypeNormal
	if warn {
		t = corev1.EventTypeWarning
	}
	b.rec.Eventf(obj, nil, t, reason, action, format, args...)
}

// addFinalizer adds f to obj, writing obj when f was missing.
func (b reconcilerBase) addFinalizer(ctx context.Context, obj client.Object, f string) error {
	if !controllerutil.AddFinalizer(obj, f) {
		return nil
	}
	return b.c.Update(ctx, obj)
}

// removeFinalizer removes f from obj, writing obj when f was there; an
// object already gone is no error.
func (b reconcilerBase) removeFinalizer(ctx context.Context, obj client.Object, f string) error {
	if !controllerutil.RemoveFinalizer(obj, f) {
		return nil
	}
	return client.IgnoreNotFound(b.c.Update(ctx, obj))
}

type sandboxReconciler struct{ reconcilerBase }

func setCond(conds *[]metav1.Condition, gen int64, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// Reconcile makes one Sandbox object's agentbox sandbox match its spec.
func (r *sandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj agentsv1.Sandbox
	if err := r.c.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	bnd, bound := r.teams.team(obj.Namespace)
	if !bound {
		return ctrl.Result{}, nil // re-queued when its namespace is bound
	}
	team := bnd.id
	if n := obj.Status.NodeName; n != "" && n != r.cfg.Node {
		// Bound to another node agent; a copy left here (its image moved
		// while this node was lost) goes.
		return r.releaseElsewhere(ctx, team, &obj)
	}
	if !obj.DeletionTimestamp.IsZero() {
		if !controllerutil.ContainsFinalizer(&obj, agentsv1.Finalizer) {
			return ctrl.Result{}, nil
		}
		if err := r.kill(ctx, team, &obj); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.dropImage(ctx, &obj, "", ""); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.removeFinalizer(ctx, &obj, agentsv1.Finalizer)
	}
	if err := r.addFinalizer(ctx, &obj, agentsv1.Finalizer); err != nil {
		return ctrl.Result{}, err
	}
	if obj.Status.NodeName == "" {
		won, res, err := r.bind(ctx, &obj)
		if err != nil || !won || obj.Status.NodeName != r.cfg.Node {
			return res, err
		}
	}
	before := obj.Status.DeepCopy()
	res, err := r.reconcile(ctx, bnd, &obj)
	obj.Status.ObservedGeneration = obj.Generation
	obj.Status.Team = team
	if !equalStatus(before, &obj.Status) {
		if uerr := r.c.Status().Update(ctx, &obj); uerr != nil && !apierrors.IsNotFound(uerr) {
			return ctrl.Result{}, errors.Join(err, uerr)
		}
	}
	if lerr := r.labelID(ctx, &obj, bnd.name); lerr != nil && !apierrors.IsConflict(lerr) {
		return ctrl.Result{}, errors.Join(err, lerr)
	}
	if err != nil && errors.Is(err, errdefs.ErrInvalidArgument) {
		return ctrl.Result{}, nil // reported in a condition; the next spec edit retries
	}
	return res, err
}

func (r *sandboxReconciler) reconcile(ctx context.Context, bnd nsBinding, obj *agentsv1.Sandbox) (ctrl.Result, error) {
	team := bnd.id
	st := &obj.Status
	gen := obj.Generation
	if t := obj.Spec.ShutdownTime; t != nil {
		if left := time.Until(t.Time); left <= 0 {
			return r.expire(ctx, team, obj)
		}
	}
	if meta.IsStatusConditionTrue(st.Conditions, agentsv1.ConditionFinished) {
		return ctrl.Result{}, nil // a finished sandbox is not restarted
	}
	if done, res, err := r.restoreMoved(ctx, team, obj); done {
		return res, err
	}
	var sb *sandbox.Sandbox
	if st.SandboxID != "" {
		got, err := r.sbs.Get(ctx, team, st.SandboxID)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			r.finished(obj, agentsv1.ReasonSandboxGone, fmt.Sprintf("sandbox %s ended (killed, timed out or failed); delete this Sandbox to free its name", st.SandboxID))
			r.event(obj, true, agentsv1.ReasonSandboxGone, "Check", "sandbox %s is gone", st.SandboxID)
			return ctrl.Result{}, nil
		case err != nil:
			return ctrl.Result{}, err
		}
		sb = got
	} else {
		sb = r.find(ctx, team, obj)
	}
	if sb == nil && bnd.refusing {
		msg := fmt.Sprintf("namespace %s holds Sandboxes or SandboxSnapshots of team %s but is labelled %s=%q: no new Sandbox starts here until team %s's are deleted (or the label names it again)",
			obj.Namespace, bnd.name, LabelTeam, bnd.pending, bnd.name)
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, ReasonTeamRebinding, msg)
		r.event(obj, true, ReasonTeamRebinding, "Create", "%s", msg)
		return ctrl.Result{}, nil // re-queued when the namespace is bound
	}
	if sb == nil {
		req, err := createRequest(obj, team, r.timeout(obj))
		if err == nil && req.ID != "" {
			err = r.checkID(ctx, obj, req.ID)
		}
		if err != nil {
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonInvalidSpec, err.Error())
			r.event(obj, true, agentsv1.ReasonInvalidSpec, "Create", "%v", err)
			return ctrl.Result{}, err
		}
		if obj.Annotations[AnnotationSnapshot] != "" {
			restored, res, err := r.fromSnapshot(ctx, team, obj, req)
			if restored == nil {
				return res, err
			}
			st.SandboxID = restored.ID
			return r.converge(ctx, team, obj, restored)
		}
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonDependenciesNotReady, "starting the sandbox")
		created, err := r.sbs.Create(ctx, req)
		if err != nil {
			reason := agentsv1.ReasonReconcilerError
			if errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound) {
				reason = agentsv1.ReasonInvalidSpec
				err = fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
			}
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, reason, "create: "+err.Error())
			r.event(obj, true, reason, "Create", "create sandbox: %v", err)
			return ctrl.Result{}, err
		}
		r.event(obj, false, "Created", "Create", "sandbox %s started from template %s", created.ID, req.Template)
		sb = created
	}
	st.SandboxID = sb.ID
	return r.converge(ctx, team, obj, sb)
}

// bind places an unbound Sandbox: every agent ranks the live node agents
// by their Leases (place) and only the one ranked first writes its node
// name into the status, guarded by the object's resourceVersion, so at most
// one wins. The others look again a renewal later, in case the first one
// died or their views differed.
func (r *sandboxReconciler) bind(ctx context.Context, obj *agentsv1.Sandbox) (bool, ctrl.Result, error) {
	retry := ctrl.Result{RequeueAfter: r.cfg.LeaseDuration / 3}
	best, why, ok, err := r.placement(ctx, obj)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			setCond(&obj.Status.Conditions, obj.Generation, agentsv1.ConditionReady, false, agentsv1.ReasonInvalidSpec, err.Error())
			return false, ctrl.Result{}, r.writeStatus(ctx, obj)
		}
		return false, ctrl.Result{}, err
	}
	if !ok {
		if c := meta.FindStatusCondition(obj.Status.Conditions, agentsv1.ConditionReady); c == nil || c.Reason != ReasonUnschedulable || c.Message != why {
			setCond(&obj.Status.Conditions, obj.Generation, agentsv1.ConditionReady, false, ReasonUnschedulable, why)
			r.event(obj, true, ReasonUnschedulable, "Bind", "%s", why)
			if err := r.writeStatus(ctx, obj); err != nil {
				return false, ctrl.Result{}, err
			}
		}
		return false, retry, nil
	}
	// A controller without a node of its own (Node "") binds for any agent.
	if r.cfg.Node != "" && best != r.cfg.Node {
		return false, retry, nil
	}
	obj.Status.NodeName = best
	if err := r.c.Status().Update(ctx, obj); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, nil // another agent bound it (its update requeues this one)
		}
		return false, ctrl.Result{}, err
	}
	r.event(obj, false, "Scheduled", "Bind", "bound to node %s", best)
	return true, ctrl.Result{}, nil
}

// writeStatus writes a Sandbox's status; a conflict or a deleted object is
// no error (the next reconcile sees the newer object).
func (b reconcilerBase) writeStatus(ctx context.Context, obj *agentsv1.Sandbox) error {
	if err := b.c.Status().Update(ctx, obj); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// converge moves a live sandbox to the operating mode asked for and writes
// what it is.
func (r *sandboxReconciler) converge(ctx context.Context, team string, obj *agentsv1.Sandbox, sb *sandbox.Sandbox) (ctrl.Result, error) {
	st, gen := &obj.Status, obj.Generation
	suspend := obj.Spec.OperatingMode == agentsv1.OperatingModeSuspended
	switch {
	case suspend && sb.State == sandbox.StateRunning:
		if err := r.sbs.Pause(ctx, team, sb.ID); err != nil {
			setCond(&st.Conditions, gen, agentsv1.ConditionSuspended, false, agentsv1.ReasonReconcilerError, "pause: "+err.Error())
			r.event(obj, true, agentsv1.ReasonReconcilerError, "Pause", "pause sandbox %s: %v", sb.ID, err)
			return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
		}
		r.event(obj, false, agentsv1.ReasonPaused, "Pause", "sandbox %s paused with its memory kept", sb.ID)
		sb.State = sandbox.StatePaused
	case !suspend && sb.State == sandbox.StatePaused:
		got, _, err := r.sbs.Resume(ctx, team, sb.ID, r.timeout(obj), false)
		if err != nil {
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonReconcilerError, "resume: "+err.Error())
			return ctrl.Result{}, err
		}
		r.event(obj, false, "Resumed", "Resume", "sandbox %s resumed", sb.ID)
		sb = got
		// The stored image is stale now: no other agent may restore it.
		if err := r.dropImage(ctx, obj, ReasonImageDropped, "resumed on node "+r.cfg.Node+"; the stored image was deleted"); err != nil {
			return ctrl.Result{}, err
		}
	}
	st.PodIPs = nil
	st.Sandbox = reportOf(sb)
	switch {
	case sb.State == sandbox.StatePaused:
		setCond(&st.Conditions, gen, agentsv1.ConditionSuspended, true, agentsv1.ReasonPaused, "paused with its memory kept")
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonSuspended, "operatingMode is Suspended")
		return r.storeImage(ctx, team, obj, sb)
	case sb.State == sandbox.StateRunning:
		if meta.FindStatusCondition(st.Conditions, agentsv1.ConditionSuspended) != nil {
			setCond(&st.Conditions, gen, agentsv1.ConditionSuspended, false, agentsv1.ReasonNotSuspended, "running")
		}
		if sb.IP.IsValid() {
			st.PodIPs = []string{sb.IP.String()}
		}
		if sb.Health != "" {
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonDependenciesNotReady, "health check: "+sb.HealthReason)
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		}
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, true, agentsv1.ReasonDependenciesReady, "sandbox "+sb.ID+" is running")
	default:
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonDependenciesNotReady, "sandbox is "+string(sb.State))
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	return r.keepAlive(ctx, team, obj, sb)
}

// keepAlive extends the sandbox before the server's timeout would end it:
// a Kubernetes sandbox lives until its object is deleted or expires.
func (r *sandboxReconciler) keepAlive(ctx context.Context, team string, obj *agentsv1.Sandbox, sb *sandbox.Sandbox) (ctrl.Result, error) {
	want := r.timeout(obj)
	if time.Until(sb.EndAt) < want/2 {
		if err := r.sbs.SetTimeout(ctx, team, sb.ID, want); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Often enough to undo a client's shorter timeout (an E2B connect sets
	// one) long before it ends the sandbox.
	next := min(want/4, time.Minute)
	if t := obj.Spec.ShutdownTime; t != nil && time.Until(t.Time) < next {
		next = time.Until(t.Time) + time.Second
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// timeout is how long the server keeps a sandbox without news from the
// controller: up to its shutdownTime, at most the server's maximum.
func (r *sandboxReconciler) timeout(obj *agentsv1.Sandbox) time.Duration {
	d := r.cfg.MaxTimeout
	if t := obj.Spec.ShutdownTime; t != nil {
		if left := time.Until(t.Time) + time.Second; left < d {
			d = max(left, time.Second)
		}
	}
	return d
}

// find returns the team's sandbox made for this object whose id a lost
// status write did not record.
func (r *sandboxReconciler) find(ctx context.Context, team string, obj *agentsv1.Sandbox) *sandbox.Sandbox {
	for _, sb := range r.sbs.List(ctx, team) {
		if sb.Metadata[MetaUID] == string(obj.UID) {
			return sb
		}
	}
	return nil
}

// kill ends the object's sandbox (recorded or found by uid).
func (r *sandboxReconciler) kill(ctx context.Context, team string, obj *agentsv1.Sandbox) error {
	ids := []string{}
	if obj.Status.SandboxID != "" {
		ids = append(ids, obj.Status.SandboxID)
	}
	if sb := r.find(ctx, team, obj); sb != nil && sb.ID != obj.Status.SandboxID {
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		if err := r.sbs.Kill(ctx, team, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("kill sandbox %s: %w", id, err)
		}
		r.event(obj, false, "Killed", "Kill", "sandbox %s killed", id)
	}
	return nil
}

func (r *sandboxReconciler) expire(ctx context.Context, team string, obj *agentsv1.Sandbox) (ctrl.Result, error) {
	if err := r.kill(ctx, team, obj); err != nil {
		return ctrl.Result{}, err
	}
	if p := obj.Spec.ShutdownPolicy; p != nil && *p == agentsv1.ShutdownPolicyDelete {
		r.event(obj, false, agentsv1.ReasonExpired, "Delete", "shutdownTime reached; deleting (shutdownPolicy Delete)")
		return ctrl.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, obj))
	}
	st := &obj.Status
	st.SandboxID, st.PodIPs = "", nil
	setCond(&st.Conditions, obj.Generation, agentsv1.ConditionReady, false, agentsv1.ReasonExpired, "shutdownTime "+obj.Spec.ShutdownTime.UTC().Format(time.RFC3339)+" reached; sandbox killed")
	return ctrl.Result{}, nil
}

func (r *sandboxReconciler) finished(obj *agentsv1.Sandbox, reason, msg string) {
	st := &obj.Status
	st.SandboxID, st.PodIPs = "", nil
	setCond(&st.Conditions, obj.Generation, agentsv1.ConditionFinished, true, reason, msg)
	setCond(&st.Conditions, obj.Generation, agentsv1.ConditionReady, false, reason, msg)
}

func equalStatus(a, b *agentsv1.SandboxStatus) bool {
	return a.SandboxID == b.SandboxID && a.NodeName == b.NodeName && a.Team == b.Team &&
		a.ObservedGeneration == b.ObservedGeneration && slices.Equal(a.PodIPs, b.PodIPs) &&
		conditionsEqual(a.Conditions, b.Conditions) &&
		(a.Sandbox == nil) == (b.Sandbox == nil) && (a.Sandbox == nil || *a.Sandbox == *b.Sandbox)
}

// reportOf is what the status says of sb, for the cluster's E2B API.
func reportOf(sb *sandbox.Sandbox) *agentsv1.SandboxReport {
	return &agentsv1.SandboxReport{TemplateID: sb.TemplateID, Alias: sb.Alias, Isolation: sb.Isolation,
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, PIDs: sb.PIDs, TmpSizeMB: sb.TmpMB,
		AllowInternetAccess: sb.AllowInternet}
}

func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}
