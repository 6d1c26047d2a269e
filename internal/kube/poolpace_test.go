package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

func TestRefillLater(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ready, want int32
		waiting     int
		later       bool
	}{
		{"no claim waits", 10, 100, 0, false},
		{"claims wait, plenty of members", 90, 100, 20, true},
		{"claims wait, members down to a tenth after them", 30, 100, 20, false},
		{"claims wait, pool empty", 0, 100, 5, false},
		{"small pool keeps one spare", 3, 4, 1, true},
		{"small pool, last spare", 2, 4, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refillLater(tc.ready, tc.want, tc.waiting); got != tc.later {
				t.Errorf("refillLater(ready %d, want %d, waiting %d) = %t, want %t", tc.ready, tc.want, tc.waiting, got, tc.later)
			}
		})
	}
}

func TestStatusPace(t *testing.T) {
	var p statusPace
	now := time.Now()
	if w := p.wait("a", now); w != 0 {
		t.Fatalf("first write waits %v", w)
	}
	if w := p.wait("a", now.Add(100*time.Millisecond)); w <= 0 || w > poolStatusEvery {
		t.Errorf("a second write within %v waits %v", poolStatusEvery, w)
	}
	if w := p.wait("b", now.Add(100*time.Millisecond)); w != 0 {
		t.Errorf("another pool's write waits %v", w)
	}
	if w := p.wait("a", now.Add(poolStatusEvery)); w != 0 {
		t.Errorf("a write %v later waits %v", poolStatusEvery, w)
	}
}

// TestPoolRefillsAfterClaims: a pool short of members but with ready ones
// to spare puts off its creates while a claim of it waits, and makes them
// once no claim waits; its status is written at most once a second, the
// counts of the last reconcile coming with the requeue.
func TestPoolRefillsAfterClaims(t *testing.T) {
	ctx := context.Background()
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "team-a"
	tpl := &extv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "tpl", Namespace: ns}}
	tpl.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "agent", Image: "base"}}
	hash, err := blueprintHash(tpl.Spec.Blueprint)
	if err != nil {
		t.Fatal(err)
	}
	replicas := int32(20)
	pool := &extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns, UID: "pool-uid", Finalizers: []string{poolFinalizer}}}
	pool.Spec.TemplateRef.Name = tpl.Name
	pool.Spec.Replicas = &replicas
	objs := []client.Object{tpl, pool}
	for i := range 15 {
		m := newMember(pool, tpl, hash)
		m.Name = fmt.Sprintf("pool-%02d", i)
		if err := controllerutil.SetControllerReference(pool, m, scheme); err != nil {
			t.Fatal(err)
		}
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: agentsv1.ConditionReady, Status: metav1.ConditionTrue, Reason: agentsv1.ReasonDependenciesReady})
		objs = append(objs, m)
	}
	claim := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: ns}}
	claim.Spec.WarmPoolRef.Name = pool.Name
	objs = append(objs, claim)
	writes := &calls{}
	var made atomic.Int32 // members are created concurrently
	server := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&agentsv1.Sandbox{}, &extv1.SandboxClaim{}, &extv1.SandboxWarmPool{}).Build()
	c := interceptor.NewClient(server.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetGenerateName() != "" && obj.GetName() == "" {
				obj.SetName(obj.GetGenerateName() + fmt.Sprint(made.Add(1)))
			}
			writes.add("create", obj)
			return c.Create(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			writes.add("update/"+sub, obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	cfg := Config{Teams: map[string]string{ns: "team"}}
	r := &poolReconciler{
		reconcilerBase: reconcilerBase{c: c, api: c, rec: events.NewFakeRecorder(100), cfg: cfg, teams: newBindings(cfg), log: slog.New(slog.DiscardHandler)},
		created:        &creations{}, paced: &statusPace{},
	}
	reconcile := func() ctrl.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: pool.Name}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	status := func() extv1.SandboxWarmPoolStatus {
		var p extv1.SandboxWarmPool
		if err := server.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			t.Fatal(err)
		}
		return p.Status
	}

	res := reconcile()
	if got := writes.get("create sandbox"); got != 0 {
		t.Errorf("%d members created while a claim waits and 15 of 20 are ready, want none yet", got)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > refillRetry {
		t.Errorf("requeue after %v, want within %v", res.RequeueAfter, refillRetry)
	}
	if st := status(); st.Replicas != 15 || st.ReadyReplicas != 15 {
		t.Errorf("status %+v, want 15 replicas, 15 ready", st)
	}

	// The claim is answered: the pool refills now.
	claim.Status.SandboxStatus.Name = "pool-00"
	meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{Type: agentsv1.ConditionReady, Status: metav1.ConditionTrue, Reason: extv1.ReasonSandboxReady})
	if err := server.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	res = reconcile()
	if got := writes.get("create sandbox"); got != 5 {
		t.Errorf("%d members created once no claim waits, want 5", got)
	}
	if got := writes.get("update/status other"); got != 1 {
		t.Errorf("%d pool status writes within a second, want 1", got)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > poolStatusEvery {
		t.Errorf("a status held back is requeued after %v, want within %v", res.RequeueAfter, poolStatusEvery)
	}
	r.paced = &statusPace{} // as a second later
	reconcile()
	if st := status(); st.Replicas != 20 || st.ReadyReplicas != 15 {
		t.Errorf("status %+v, want 20 replicas, 15 ready", st)
	}
}
