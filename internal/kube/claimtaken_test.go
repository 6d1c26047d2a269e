package kube

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// calls counts a fake API server's requests by "verb kind".
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(verb string, obj any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[verb+" "+kindOf(obj)]++
}

func (c *calls) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func kindOf(obj any) string {
	switch obj.(type) {
	case *extv1.SandboxClaim:
		return "claim"
	case *agentsv1.Sandbox:
		return "sandbox"
	case *extv1.SandboxClaimList:
		return "claims"
	}
	return "other"
}

// claimFixture is a pool with one ready member, its template and a new
// claim of it, in a fake API server. cache is what the reconciler reads as
// its cache: it may be told to lag (stale returns the claim as first
// created); api counts what reads past the cache.
type claimFixture struct {
	r       *claimReconciler
	api     *calls
	writes  *calls
	stale   bool
	created *extv1.SandboxClaim
	member  string
	server  client.Client
}

func newClaimFixture(t *testing.T) *claimFixture {
	t.Helper()
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
	pool := &extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns, UID: "pool-uid"}}
	pool.Spec.TemplateRef.Name = tpl.Name
	member := newMember(pool, tpl, hash)
	member.Name = "pool-abcde"
	if err := controllerutil.SetControllerReference(pool, member, scheme); err != nil {
		t.Fatal(err)
	}
	member.Status.SandboxID = "sbx1"
	meta.SetStatusCondition(&member.Status.Conditions, metav1.Condition{Type: agentsv1.ConditionReady, Status: metav1.ConditionTrue, Reason: agentsv1.ReasonDependenciesReady})
	other := member.DeepCopy()
	other.Name = "pool-fghij"
	other.CreationTimestamp = metav1.NewTime(time.Now().Add(time.Hour)) // the newer
	claim := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: ns, UID: "claim-uid"}}
	claim.Spec.WarmPoolRef.Name = pool.Name
	claim2 := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c2", Namespace: ns, UID: "claim2-uid"}}
	claim2.Spec.WarmPoolRef.Name = pool.Name

	f := &claimFixture{api: &calls{}, writes: &calls{}, member: member.Name}
	server := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(tpl, pool, member, other, claim, claim2).
		WithStatusSubresource(&agentsv1.Sandbox{}, &extv1.SandboxClaim{}, &extv1.SandboxWarmPool{}).
		WithIndex(&agentsv1.Sandbox{}, claimOwnerIndex, claimOwnerOf).
		Build()
	f.server = server
	f.created = claim.DeepCopy()
	if err := server.Get(context.Background(), client.ObjectKeyFromObject(claim), f.created); err != nil {
		t.Fatal(err)
	}
	var members agentsv1.SandboxList
	if err := server.List(context.Background(), &members, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	cached := interceptor.NewClient(server.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if cl, ok := obj.(*extv1.SandboxClaim); ok && f.stale && key.Name == f.created.Name {
				f.created.DeepCopyInto(cl)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if l, ok := list.(*agentsv1.SandboxList); ok && f.stale {
				members.DeepCopyInto(l) // both still ready members of the pool
				return nil
			}
			return c.List(ctx, list, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			f.writes.add("update", obj)
			return c.Update(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			f.writes.add("update/"+sub, obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	apiReader := interceptor.NewClient(server.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			f.api.add("get", obj)
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			f.api.add("list", list)
			return c.List(ctx, list, opts...)
		},
	})
	cfg := Config{Teams: map[string]string{ns: "team"}, Workers: DefaultWorkers}
	f.r = &claimReconciler{
		reconcilerBase: reconcilerBase{c: cached, api: apiReader, rec: events.NewFakeRecorder(100), cfg: cfg, teams: newBindings(cfg), log: slog.New(slog.DiscardHandler)},
		taken:          &taken{},
		before:         &preexisting{},
	}
	return f
}

func (f *claimFixture) reconcile(t *testing.T, claim ...string) {
	t.Helper()
	name := "c1"
	if len(claim) > 0 {
		name = claim[0]
	}
	if _, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

// TestClaimAdoptsWithoutReadingPastTheCache checks the claim's fast path:
// a new claim adopts the ready member with two writes (the member, its
// status; no finalizer) and no read of itself from the API server (one list
// of the namespace's claims per leader), and a reconcile from a cache that
// lags its status write neither adopts again nor reads the API server; a new
// leader (nothing remembered) lists the claims once, and does not adopt again.
func TestClaimAdoptsWithoutReadingPastTheCache(t *testing.T) {
	f := newClaimFixture(t)
	f.reconcile(t)
	var claim extv1.SandboxClaim
	if err := f.r.c.Get(context.Background(), types.NamespacedName{Namespace: "team-a", Name: "c1"}, &claim); err != nil {
		t.Fatal(err)
	}
	if claim.Status.SandboxStatus.Name != f.member || !meta.IsStatusConditionTrue(claim.Status.Conditions, agentsv1.ConditionReady) {
		t.Fatalf("claim status %+v, want Ready holding %s", claim.Status, f.member)
	}
	if len(claim.Finalizers) != 0 {
		t.Errorf("claim finalizers %v, want none: its Sandbox's owner reference is enough", claim.Finalizers)
	}
	for key, want := range map[string]int{"update claim": 0, "update sandbox": 1, "update/status claim": 1} {
		if got := f.writes.get(key); got != want {
			t.Errorf("%s: %d writes, want %d", key, got, want)
		}
	}
	f.reconcile(t, "c2")
	if got := f.api.get("get claim"); got != 0 {
		t.Errorf("new claims read themselves from the API server %d times", got)
	}
	if got := f.api.get("list claims"); got != 1 {
		t.Errorf("the namespace's claims were listed from the API server %d times for two claims, want once", got)
	}

	// The cache lags: it shows the claim as created, without the status
	// this process wrote.
	f.stale = true
	f.reconcile(t)
	if got := f.writes.get("update sandbox"); got != 2 {
		t.Errorf("a reconcile from a lagging cache adopted again (%d Sandbox updates for two claims)", got)
	}
	if got := f.api.get("get claim") + f.api.get("list claims"); got != 1 {
		t.Errorf("a reconcile from a lagging cache read the API server (%d reads in all), though this process wrote the status", got)
	}

	// A new leader remembers nothing: the API server says the claim holds one.
	f.r.taken, f.r.before = &taken{}, &preexisting{}
	f.reconcile(t)
	if got := f.api.get("list claims"); got != 2 {
		t.Errorf("a new leader with a lagging cache listed the claims from the API server %d times in all, want 2", got)
	}
	if got := f.writes.get("update sandbox"); got != 2 {
		t.Errorf("a new leader adopted again (%d Sandbox updates for two claims)", got)
	}
	if got := f.writes.get("update/status claim"); got != 2 {
		t.Errorf("a new leader wrote the status from a lagging cache (%d status writes for two claims)", got)
	}
}

// TestClaimRewritesStatusAfterAFailedWrite: a claim that took a member but
// whose status write failed writes it on the next reconcile, naming the
// same member.
func TestClaimRewritesStatusAfterAFailedWrite(t *testing.T) {
	f := newClaimFixture(t)
	f.r.taken.put("claim-uid", f.member)
	f.stale = true
	f.reconcile(t)
	if got := f.writes.get("update/status claim"); got != 1 {
		t.Fatalf("%d status writes, want 1", got)
	}
	if got := f.writes.get("update sandbox"); got != 0 {
		t.Errorf("adopted another member (%d Sandbox updates)", got)
	}
	if got := f.api.get("get claim"); got != 0 {
		t.Errorf("read the API server %d times", got)
	}
}

// TestClaimSkipsMemberTakenHere: a second claim reconciled while the cache
// still lists the member the first one took as ready adopts the other
// member with one update, not a conflict first; once the cache shows a
// newer version of a reserved member still in the pool, it is free again.
func TestClaimSkipsMemberTakenHere(t *testing.T) {
	f := newClaimFixture(t)
	f.reconcile(t, "c1")
	f.stale = true
	f.reconcile(t, "c2")
	if got := f.writes.get("update sandbox"); got != 2 {
		t.Errorf("%d Sandbox updates for two adoptions, want 2 (no conflict)", got)
	}
	f.stale = false
	var c1, c2 extv1.SandboxClaim
	for name, cl := range map[string]*extv1.SandboxClaim{"c1": &c1, "c2": &c2} {
		if err := f.r.c.Get(context.Background(), types.NamespacedName{Namespace: "team-a", Name: name}, cl); err != nil {
			t.Fatal(err)
		}
	}
	if c1.Status.SandboxStatus.Name == "" || c1.Status.SandboxStatus.Name == c2.Status.SandboxStatus.Name {
		t.Errorf("claims hold %q and %q, want two distinct members", c1.Status.SandboxStatus.Name, c2.Status.SandboxStatus.Name)
	}

	var tk taken
	if !tk.reserve("ns/m", "1") || tk.reserve("ns/m", "1") {
		t.Error("a member reserved at a version was reserved again at that version")
	}
	if !tk.reserve("ns/m", "2") {
		t.Error("a newer version of a reserved member stayed reserved")
	}
	tk.unreserve("ns/m")
	if !tk.reserve("ns/m", "2") {
		t.Error("an unreserved member stayed reserved")
	}
}

// TestClaimDeletedReleasesItsSandbox: a claim has no finalizer, so it is
// gone at once when deleted; its reconcile then deletes the Sandbox it
// controlled (no garbage collector on a bare API server), and one left by an
// earlier claim of the same name, but not the Sandbox of the claim now of
// that name. A claim that still has the finalizer claims used to get is
// released and let go.
func TestClaimDeletedReleasesItsSandbox(t *testing.T) {
	ctx := context.Background()
	gone := func(f *claimFixture, name string) bool {
		var sb agentsv1.Sandbox
		err := f.server.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: name}, &sb)
		return apierrors.IsNotFound(err) || (err == nil && !sb.DeletionTimestamp.IsZero())
	}
	held := func(f *claimFixture, name string) string {
		var cl extv1.SandboxClaim
		if err := f.server.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: name}, &cl); err != nil {
			t.Fatal(err)
		}
		return cl.Status.SandboxStatus.Name
	}

	t.Run("deleted", func(t *testing.T) {
		f := newClaimFixture(t)
		f.reconcile(t)
		sb := held(f, "c1")
		f.reconcile(t, "c2")
		other := held(f, "c2")
		if err := f.server.Delete(ctx, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a"}}); err != nil {
			t.Fatal(err)
		}
		f.reconcile(t)
		if !gone(f, sb) {
			t.Errorf("Sandbox %s of the deleted claim is still there", sb)
		}
		if gone(f, other) {
			t.Errorf("Sandbox %s of another claim was deleted", other)
		}
	})

	t.Run("replaced by a claim of the same name", func(t *testing.T) {
		f := newClaimFixture(t)
		f.reconcile(t)
		old := held(f, "c1")
		if err := f.server.Delete(ctx, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a"}}); err != nil {
			t.Fatal(err)
		}
		again := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", UID: "claim-uid-2"}}
		again.Spec.WarmPoolRef.Name = "pool"
		if err := f.server.Create(ctx, again); err != nil {
			t.Fatal(err)
		}
		f.reconcile(t)
		if !gone(f, old) {
			t.Errorf("Sandbox %s of the earlier claim c1 is still there", old)
		}
		now := held(f, "c1")
		if now == "" || now == old || gone(f, now) {
			t.Errorf("the new claim c1 holds %q (the earlier one held %q), want a live Sandbox of its own", now, old)
		}
	})

	t.Run("still holding the old finalizer", func(t *testing.T) {
		f := newClaimFixture(t)
		var cl extv1.SandboxClaim
		key := types.NamespacedName{Namespace: "team-a", Name: "c1"}
		if err := f.server.Get(ctx, key, &cl); err != nil {
			t.Fatal(err)
		}
		cl.Finalizers = []string{claimFinalizer}
		if err := f.server.Update(ctx, &cl); err != nil {
			t.Fatal(err)
		}
		f.reconcile(t)
		sb := held(f, "c1")
		if err := f.server.Delete(ctx, &cl); err != nil {
			t.Fatal(err)
		}
		f.reconcile(t)
		if !gone(f, sb) {
			t.Errorf("Sandbox %s of the deleted claim is still there", sb)
		}
		if err := f.server.Get(ctx, key, &cl); !apierrors.IsNotFound(err) {
			t.Errorf("the claim is still there (%v, finalizers %v)", err, cl.Finalizers)
		}
	})
}
