package kube

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// claimFinalizer held a claim until its sandbox was deleted. Claims no
// longer get it (claimowned.go); one that still has it is released when
// deleted.
const claimFinalizer = "extensions.agents.x-k8s.io/agentbox-claim"

type claimReconciler struct {
	reconcilerBase
	// taken covers the cache's lag behind this reconciler's adoptions.
	taken *taken
	// before covers the cache's lag behind an earlier leader's writes.
	before *preexisting
}

// Reconcile gives a claim a ready sandbox: a ready member of its pool made
// from the template's current blueprint, else a cold start.
func (r *claimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var claim extv1.SandboxClaim
	if err := r.c.Get(ctx, req.NamespacedName, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			if _, bound := r.teams.team(req.Namespace); bound {
				return ctrl.Result{}, r.releaseOrphans(ctx, req.NamespacedName, "")
			}
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, bound := r.teams.team(claim.Namespace); !bound {
		return ctrl.Result{}, nil
	}
	if !claim.DeletionTimestamp.IsZero() {
		// Held by the finalizer claims used to get, or by someone else's:
		// its sandbox goes now.
		if claim.Status.SandboxStatus.Name == "" {
			claim.Status.SandboxStatus.Name, _ = r.taken.get(claim.UID)
		}
		if err := r.release(ctx, &claim); err != nil {
			return ctrl.Result{}, err
		}
		r.taken.forget(claim.UID)
		return ctrl.Result{}, r.removeFinalizer(ctx, &claim, claimFinalizer)
	}
	if err := r.releaseOrphans(ctx, req.NamespacedName, claim.UID); err != nil {
		return ctrl.Result{}, err
	}
	took, written := r.taken.get(claim.UID)
	if written && claim.Status.SandboxStatus.Name == "" {
		// The cache lags this process's own status write, whose event
		// reconciles the claim again: a write now would only conflict.
		return ctrl.Result{}, nil
	}
	before := claim.Status.DeepCopy()
	switch {
	case claim.Status.SandboxStatus.Name != "":
		r.taken.forget(claim.UID) // the cache shows the status write
		r.before.forget(claim.UID)
	case took != "":
		// Taken here, but the status write failed: write it again.
		claim.Status.SandboxStatus.Name = took
	default:
		// An earlier leader may have served it and the cache not show it
		// yet: a claim that already holds a member must not adopt a second.
		held, existed, err := r.before.sandbox(ctx, r.api, &claim)
		if err != nil {
			return ctrl.Result{}, err
		}
		if existed && held != "" {
			return ctrl.Result{RequeueAfter: time.Second}, nil // its event comes
		}
	}
	res, err := r.reconcile(ctx, &claim)
	if !claimStatusEqual(before, &claim.Status) {
		// Guarded by the cached resourceVersion: a claim changed since
		// conflicts, and taken brings the member to the next reconcile.
		if uerr := r.c.Status().Update(ctx, &claim); uerr != nil && !apierrors.IsNotFound(uerr) {
			return ctrl.Result{}, uerr
		}
		if name := claim.Status.SandboxStatus.Name; name != "" {
			r.taken.wrote(claim.UID, name)
		}
	}
	return res, err
}

func (r *claimReconciler) reconcile(ctx context.Context, claim *extv1.SandboxClaim) (ctrl.Result, error) {
	st, gen := &claim.Status, claim.Generation
	lc := claim.Spec.Lifecycle
	if lc != nil && lc.ShutdownTime != nil && time.Until(lc.ShutdownTime.Time) <= 0 {
		if err := r.release(ctx, claim); err != nil {
			return ctrl.Result{}, err
		}
		switch lc.ShutdownPolicy {
		case extv1.ClaimShutdownDelete, extv1.ClaimShutdownDeleteForeground:
			return ctrl.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, claim))
		}
		st.SandboxStatus = extv1.ClaimedSandbox{}
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, extv1.ReasonClaimExpired, "shutdownTime reached; sandbox deleted")
		return ctrl.Result{}, nil
	}
	if c := meta.FindStatusCondition(st.Conditions, agentsv1.ConditionReady); c != nil && c.Reason == extv1.ReasonClaimExpired {
		return ctrl.Result{}, nil // expired and retained
	}
	name := st.SandboxStatus.Name
	if name == "" {
		got, err := r.acquire(ctx, claim)
		if err != nil {
			return ctrl.Result{}, err
		}
		if got == "" {
			// Its condition says why; the pool or template may come.
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		name = got
		st.SandboxStatus.Name = name
		r.taken.put(claim.UID, name)
	}
	var sb agentsv1.Sandbox
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			st.SandboxStatus = extv1.ClaimedSandbox{Name: name}
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, agentsv1.ReasonSandboxGone, "Sandbox "+name+" was deleted")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	st.SandboxStatus.PodIPs = slices.Clone(sb.Status.PodIPs)
	st.SandboxStatus.SandboxID = sb.Status.SandboxID
	if c := meta.FindStatusCondition(sb.Status.Conditions, agentsv1.ConditionFinished); c != nil && c.Status == metav1.ConditionTrue {
		setCond(&st.Conditions, gen, agentsv1.ConditionFinished, true, c.Reason, c.Message)
		if lc != nil && lc.TTLSecondsAfterFinished != nil {
			left := time.Until(c.LastTransitionTime.Add(time.Duration(*lc.TTLSecondsAfterFinished) * time.Second))
			if left <= 0 {
				return ctrl.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, claim))
			}
			return ctrl.Result{RequeueAfter: left}, nil
		}
	}
	ready := meta.FindStatusCondition(sb.Status.Conditions, agentsv1.ConditionReady)
	switch {
	case ready != nil && ready.Status == metav1.ConditionTrue:
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, true, extv1.ReasonSandboxReady, "Sandbox "+name+" is ready: "+sb.Status.SandboxID)
	case ready != nil:
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, ready.Reason, ready.Message)
	default:
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, extv1.ReasonSandboxNotReady, "Sandbox "+name+" is starting")
	}
	if lc != nil && lc.ShutdownTime != nil {
		return ctrl.Result{RequeueAfter: time.Until(lc.ShutdownTime.Time) + time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// acquire adopts a ready pool member or cold-starts a sandbox; "" with no
// error when the claim cannot be served yet (its condition says why).
func (r *claimReconciler) acquire(ctx context.Context, claim *extv1.SandboxClaim) (string, error) {
	st, gen := &claim.Status, claim.Generation
	var pool extv1.SandboxWarmPool
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.WarmPoolRef.Name}, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			msg := fmt.Sprintf("SandboxWarmPool %q (spec.warmPoolRef.name) not found in namespace %q", claim.Spec.WarmPoolRef.Name, claim.Namespace)
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, extv1.ReasonWarmPoolNotFound, msg)
			r.event(claim, true, extv1.ReasonWarmPoolNotFound, "Claim", "%s", msg)
			return "", nil
		}
		return "", err
	}
	var tpl extv1.SandboxTemplate
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: pool.Spec.TemplateRef.Name}, &tpl); err != nil {
		if apierrors.IsNotFound(err) {
			msg := fmt.Sprintf("SandboxTemplate %q (spec.sandboxTemplateRef.name of SandboxWarmPool %q) not found in namespace %q", pool.Spec.TemplateRef.Name, pool.Name, claim.Namespace)
			setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, extv1.ReasonTemplateNotFound, msg)
			r.event(claim, true, extv1.ReasonTemplateNotFound, "Claim", "%s", msg)
			return "", nil
		}
		return "", err
	}
	if msg := claimRefusal(claim, &tpl); msg != "" {
		setCond(&st.Conditions, gen, agentsv1.ConditionReady, false, extv1.ReasonInvalidClaim, msg)
		r.event(claim, true, extv1.ReasonInvalidClaim, "Claim", "%s", msg)
		return "", nil
	}
	hash, err := blueprintHash(tpl.Spec.Blueprint)
	if err != nil {
		return "", err
	}
	if len(claim.Spec.Env) == 0 {
		if name, err := r.adopt(ctx, claim, &pool, hash); err != nil || name != "" {
			return name, err
		}
	}
	return r.coldStart(ctx, claim, &tpl)
}

// claimRefusal says why the template's policies refuse the claim.
func claimRefusal(claim *extv1.SandboxClaim, tpl *extv1.SandboxTemplate) string {
	if len(claim.Spec.VolumeClaimTemplates) > 0 {
		return "spec.volumeClaimTemplates: not supported by agentbox yet"
	}
	pol := tpl.Spec.EnvVarsInjectionPolicy
	if len(claim.Spec.Env) == 0 || pol == extv1.EnvVarsOverrides {
		return ""
	}
	if pol == "" || pol == extv1.EnvVarsDisallowed {
		return fmt.Sprintf("spec.env: SandboxTemplate %q has envVarsInjectionPolicy Disallowed; remove spec.env or set the policy to Allowed", tpl.Name)
	}
	defined := map[string]bool{}
	if cs := tpl.Spec.PodTemplate.Spec.Containers; len(cs) > 0 {
		for _, e := range cs[0].Env {
			defined[e.Name] = true
		}
	}
	for i, e := range claim.Spec.Env {
		if defined[e.Name] {
			return fmt.Sprintf("spec.env[%d]: %q is set by SandboxTemplate %q, whose envVarsInjectionPolicy Allowed forbids overriding it", i, e.Name, tpl.Name)
		}
	}
	return ""
}

// adopt takes a ready, fresh member of the pool, preferring the oldest. The
// update is guarded by the member's resourceVersion: two claims never get
// one member. Candidates come from the cache (a stale one only costs a
// conflict), and each claim starts at its own place among the oldest, so
// claims arriving together do not all race for the same member.
func (r *claimReconciler) adopt(ctx context.Context, claim *extv1.SandboxClaim, pool *extv1.SandboxWarmPool, hash string) (string, error) {
	var ready []*agentsv1.Sandbox
	// The cache first; when it shows no ready member, the API server, in
	// case one just became ready: a cold start is the slow way.
	for _, rd := range []client.Reader{r.c, r.api} {
		var list agentsv1.SandboxList
		// Read-only views of the cache: the one taken is copied before its edit.
		if err := rd.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{agentsv1.LabelWarmPool: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
			return "", fmt.Errorf("list pool members: %w", err)
		}
		for i := range list.Items {
			m := &list.Items[i]
			if metav1.IsControlledBy(m, pool) && m.DeletionTimestamp.IsZero() && m.Labels[agentsv1.LabelTemplateHash] == hash &&
				meta.IsStatusConditionTrue(m.Status.Conditions, agentsv1.ConditionReady) {
				ready = append(ready, m)
			}
		}
		if len(ready) > 0 {
			break
		}
	}
	slices.SortFunc(ready, func(a, b *agentsv1.Sandbox) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	h := fnv.New32a()
	h.Write([]byte(claim.UID))
	spread := min(len(ready), r.cfg.Workers*2, 64)
	start := 0
	if spread > 0 {
		start = int(h.Sum32() % uint32(spread))
	}
	for i := range ready {
		pick := ready[(start+i)%len(ready)]
		key := pick.Namespace + "/" + pick.Name
		if !r.taken.reserve(key, pick.ResourceVersion) {
			continue // another claim here has it
		}
		m := pick.DeepCopy()
		delete(m.Labels, agentsv1.LabelWarmPool)
		m.OwnerReferences = nil
		for k, v := range claim.Spec.AdditionalPodMetadata.Labels {
			m.Labels[k] = v
		}
		if err := controllerutil.SetControllerReference(claim, m, r.c.Scheme()); err != nil {
			r.taken.unreserve(key)
			return "", err
		}
		if err := r.c.Update(ctx, m); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				continue // another claim took it, or the cache was behind
			}
			r.taken.unreserve(key)
			return "", err
		}
		r.event(claim, false, "Adopted", "Claim", "adopted warm Sandbox %s (sandbox %s)", m.Name, m.Status.SandboxID)
		return m.Name, nil
	}
	return "", nil
}

// coldStart creates a Sandbox named after the claim from the template.
func (r *claimReconciler) coldStart(ctx context.Context, claim *extv1.SandboxClaim, tpl *extv1.SandboxTemplate) (string, error) {
	s := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{
		Name: claim.Name, Namespace: claim.Namespace,
		Labels:      map[string]string{agentsv1.LabelLaunchType: "cold"},
		Annotations: map[string]string{agentsv1.AnnotationTemplateRef: tpl.Name},
		Finalizers:  []string{agentsv1.Finalizer},
	}}
	for k, v := range claim.Spec.AdditionalPodMetadata.Labels {
		s.Labels[k] = v
	}
	if id := claim.Annotations[AnnotationSandboxID]; id != "" {
		s.Annotations[AnnotationSandboxID] = id // the id an API replica chose
	}
	s.Spec.Blueprint = *tpl.Spec.Blueprint.DeepCopy()
	if cs := s.Spec.PodTemplate.Spec.Containers; len(cs) > 0 {
		for _, e := range claim.Spec.Env {
			c := &cs[0]
			i := slices.IndexFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name })
			if i >= 0 {
				c.Env[i].Value, c.Env[i].ValueFrom = e.Value, nil
			} else {
				c.Env = append(c.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
			}
		}
	}
	if err := controllerutil.SetControllerReference(claim, s, r.c.Scheme()); err != nil {
		return "", err
	}
	if err := r.c.Create(ctx, s); apierrors.IsAlreadyExists(err) {
		// Ours from an earlier try, or someone else's: never take over a
		// Sandbox the claim did not make.
		var have agentsv1.Sandbox
		if err := r.api.Get(ctx, client.ObjectKeyFromObject(s), &have); err != nil {
			return "", err
		}
		if !metav1.IsControlledBy(&have, claim) {
			msg := fmt.Sprintf("a Sandbox named %q exists and is not this claim's; rename the claim or delete that Sandbox", s.Name)
			setCond(&claim.Status.Conditions, claim.Generation, agentsv1.ConditionReady, false, extv1.ReasonInvalidClaim, msg)
			return "", nil
		}
		return s.Name, nil
	} else if err != nil {
		return "", fmt.Errorf("create Sandbox %s: %w", s.Name, err)
	}
	r.event(claim, false, "ColdStart", "Claim", "created Sandbox %s from SandboxTemplate %s", s.Name, tpl.Name)
	return s.Name, nil
}

// release deletes the claim's sandbox if the claim controls it.
func (r *claimReconciler) release(ctx context.Context, claim *extv1.SandboxClaim) error {
	name := claim.Status.SandboxStatus.Name
	if name == "" {
		return nil
	}
	var sb agentsv1.Sandbox
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &sb); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&sb, claim) {
		return nil
	}
	return client.IgnoreNotFound(r.c.Delete(ctx, &sb))
}

func claimStatusEqual(a, b *extv1.SandboxClaimStatus) bool {
	return a.SandboxStatus.Name == b.SandboxStatus.Name && a.SandboxStatus.SandboxID == b.SandboxStatus.SandboxID &&
		slices.Equal(a.SandboxStatus.PodIPs, b.SandboxStatus.PodIPs) && conditionsEqual(a.Conditions, b.Conditions)
}
