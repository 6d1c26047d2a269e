package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// poolFinalizer holds a pool until its unclaimed members are deleted (the
// garbage collector may not run, e.g. on a bare API server).
const poolFinalizer = "extensions.agents.x-k8s.io/agentbox-warm-pool"

type poolReconciler struct {
	reconcilerBase
	// created covers the cache's lag behind this reconciler's own creates.
	created *creations
	// paced spaces each pool's status writes.
	paced *statusPace
}

// members lists the pool's unclaimed sandboxes from the cache: a listing
// from the API server on every reconcile costs it more than the rest of a
// burst of claims.
func (b reconcilerBase) members(ctx context.Context, pool *extv1.SandboxWarmPool) ([]agentsv1.Sandbox, error) {
	var list agentsv1.SandboxList
	if err := b.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{agentsv1.LabelWarmPool: pool.Name}); err != nil {
		return nil, fmt.Errorf("list pool members: %w", err)
	}
	out := list.Items[:0]
	for _, s := range list.Items {
		if metav1.IsControlledBy(&s, pool) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Reconcile keeps spec.replicas ready members made from the template's
// current blueprint.
func (r *poolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pool extv1.SandboxWarmPool
	if err := r.c.Get(ctx, req.NamespacedName, &pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, bound := r.teams.team(pool.Namespace); !bound {
		return ctrl.Result{}, nil
	}
	members, err := r.members(ctx, &pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		for i := range members {
			if err := r.c.Delete(ctx, &members[i]); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
		r.created.forget(pool.UID)
		r.paced.forget(pool.UID)
		return ctrl.Result{}, r.removeFinalizer(ctx, &pool, poolFinalizer)
	}
	if err := r.addFinalizer(ctx, &pool, poolFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	var tpl extv1.SandboxTemplate
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}, &tpl); err != nil {
		if apierrors.IsNotFound(err) {
			r.event(&pool, true, extv1.ReasonTemplateNotFound, "Replenish", "SandboxTemplate %q not found in namespace %q (spec.sandboxTemplateRef.name)", pool.Spec.TemplateRef.Name, pool.Namespace)
			// The template's creation enqueues the pool, unless the pool
			// was not yet in the cache then: look again.
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	hash, err := blueprintHash(tpl.Spec.Blueprint)
	if err != nil {
		return ctrl.Result{}, err
	}
	want := int32(1)
	if pool.Spec.Replicas != nil {
		want = *pool.Spec.Replicas
	}
	recreate := pool.Spec.UpdateStrategy != nil && pool.Spec.UpdateStrategy.Type == extv1.UpdateRecreate
	var keep []agentsv1.Sandbox
	for _, s := range members {
		if !s.DeletionTimestamp.IsZero() {
			continue
		}
		stale := s.Labels[agentsv1.LabelTemplateHash] != hash
		finished := meta.IsStatusConditionTrue(s.Status.Conditions, agentsv1.ConditionFinished)
		if (stale && recreate) || finished {
			if err := r.c.Delete(ctx, &s); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
			r.event(&pool, false, "Replaced", "Replenish", "deleted member %s (stale: %t, finished: %t)", s.Name, stale, finished)
			continue
		}
		keep = append(keep, s)
	}
	// Too many: drop the not-ready and stale first.
	slices.SortStableFunc(keep, func(a, b agentsv1.Sandbox) int { return memberRank(b, hash) - memberRank(a, hash) })
	for int32(len(keep)) > want {
		last := keep[len(keep)-1]
		if err := r.c.Delete(ctx, &last); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		keep = keep[:len(keep)-1]
	}
	ready := int32(0)
	for _, s := range keep {
		if meta.IsStatusConditionTrue(s.Status.Conditions, agentsv1.ConditionReady) {
			ready++
		}
	}
	var res ctrl.Result
	// A create counts as seen once the cache holds it in any state: a
	// member adopted since is no longer the pool's, and is replaced.
	seen := func(name string) bool {
		return r.c.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: name}, &agentsv1.Sandbox{}) == nil
	}
	if n := int32(len(keep) + r.created.pending(pool.UID, seen)); n < want {
		waiting, err := r.waitingClaims(ctx, &pool)
		if err != nil {
			return ctrl.Result{}, err
		}
		if refillLater(ready, want, waiting) {
			res.RequeueAfter = refillRetry
			n = want
		}
		made, err := r.createMembers(ctx, &pool, &tpl, hash, int(want-n))
		keep = append(keep, made...)
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	st := extv1.SandboxWarmPoolStatus{
		Replicas: int32(len(keep)), ReadyReplicas: ready, ObservedGeneration: pool.Generation,
		Selector: labels.SelectorFromSet(labels.Set{agentsv1.LabelWarmPool: pool.Name}).String(),
	}
	if st != pool.Status {
		if wait := r.paced.wait(pool.UID, time.Now()); wait > 0 {
			// Written with the counts of then; the requeue comes back.
			if res.RequeueAfter == 0 || wait < res.RequeueAfter {
				res.RequeueAfter = wait
			}
			return res, nil
		}
		pool.Status = st
		// A conflict is no error: the newer pool's event reconciles it again.
		if err := r.c.Status().Update(ctx, &pool); err != nil && !apierrors.IsConflict(err) {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	return res, nil
}

// createMembers creates n members in batches of 1, 2, 4, ... up to
// maxCreateBatch at once (the ReplicaSet controller's slow start): one at a
// time, a pool that refills after a burst waits on each create's round trip
// in turn; all at once, a failing create (quota, webhook) fails n times.
func (r *poolReconciler) createMembers(ctx context.Context, pool *extv1.SandboxWarmPool, tpl *extv1.SandboxTemplate, hash string, n int) ([]agentsv1.Sandbox, error) {
	var made []agentsv1.Sandbox
	for batch := 1; n > 0; batch = min(batch*2, maxCreateBatch) {
		size := min(batch, n)
		out := make([]*agentsv1.Sandbox, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for i := range size {
			wg.Go(func() {
				s := newMember(pool, tpl, hash)
				if err := controllerutil.SetControllerReference(pool, s, r.c.Scheme()); err != nil {
					errs[i] = err
					return
				}
				if err := r.c.Create(ctx, s); err != nil {
					errs[i] = fmt.Errorf("create pool member: %w", err)
					return
				}
				r.created.add(pool.UID, s.Name)
				out[i] = s
			})
		}
		wg.Wait()
		for _, s := range out {
			if s != nil {
				made = append(made, *s)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return made, err
		}
		n -= size
	}
	return made, nil
}

// maxCreateBatch bounds a pool's creates in flight.
const maxCreateBatch = 32

// memberRank orders members to keep: ready and fresh first.
func memberRank(s agentsv1.Sandbox, hash string) int {
	r := 0
	if meta.IsStatusConditionTrue(s.Status.Conditions, agentsv1.ConditionReady) {
		r += 2
	}
	if s.Labels[agentsv1.LabelTemplateHash] == hash {
		r++
	}
	return r
}

// newMember is a pool sandbox made from the template.
func newMember(pool *extv1.SandboxWarmPool, tpl *extv1.SandboxTemplate, hash string) *agentsv1.Sandbox {
	lbl := maps.Clone(tpl.Spec.PodTemplate.ObjectMeta.Labels)
	if lbl == nil {
		lbl = map[string]string{}
	}
	lbl[agentsv1.LabelWarmPool] = pool.Name
	lbl[agentsv1.LabelTemplateHash] = hash
	lbl[agentsv1.LabelLaunchType] = "warm"
	s := &agentsv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: pool.Name + "-",
			Namespace:    pool.Namespace,
			Labels:       lbl,
			Annotations:  map[string]string{agentsv1.AnnotationTemplateRef: tpl.Name},
			// Born with the agent's finalizer: no update to add it later.
			Finalizers: []string{agentsv1.Finalizer},
		},
	}
	s.Spec.Blueprint = *tpl.Spec.Blueprint.DeepCopy()
	return s
}
