package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	kubectl "github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// defaultKwok is where scripts/k8s-test-bins.sh puts kwok.
const defaultKwok = "/var/cache/agentbox/k8s-bin/kwok-v0.8.0/kwok"

const (
	kwokNodes  = 10
	scalePools = 4
)

// kwokStages make kwok the node agents of the kwok-node-* nodes: a Sandbox
// bound to one becomes Ready with a sandbox id and an address, as a real
// agent reports it, and a deleted one loses the agent's finalizer, as when
// its agent has killed the sandbox.
func kwokStages() string {
	var nodes string
	for i := range kwokNodes {
		nodes += fmt.Sprintf("\n      - kwok-node-%d", i)
	}
	return `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: sandbox-ready
spec:
  resourceRef:
    apiGroup: agents.x-k8s.io/v1beta1
    kind: Sandbox
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.sandboxID
      operator: DoesNotExist
    - key: .status.nodeName
      operator: In
      values:` + nodes + `
  steps:
  - patch:
      subresource: status
      root: status
      type: merge
      template: |
        sandboxID: {{ printf "kwok%s" (.metadata.uid | replace "-" "" | trunc 16) | Quote }}
        podIPs:
        - {{ printf "10.%d.%d.%d" (randInt 0 255) (randInt 0 255) (randInt 1 255) | Quote }}
        observedGeneration: {{ .metadata.generation }}
        conditions:
        - type: Ready
          status: "True"
          reason: DependenciesReady
          message: simulated by kwok
          observedGeneration: {{ .metadata.generation }}
          lastTransitionTime: {{ Now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: sandbox-delete
spec:
  resourceRef:
    apiGroup: agents.x-k8s.io/v1beta1
    kind: Sandbox
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
    - key: .status.nodeName
      operator: In
      values:` + nodes + `
  steps:
  - finalizers:
      remove:
      - value: ` + agentsv1.Finalizer + `
`
}

// TestKubeScaleKwok measures the controller alone (`serve --kube-controller`
// without --kube-node) against kwok-simulated node agents: warm pools hold
// 1,000 ready members; 1,000 claims arrive at a steady rate (agent-sandbox's
// continuous burst), then, once the pools refilled, 1,000 more at once; each
// must adopt a distinct warm member, the pools must refill, and deleting
// everything must leave nothing. It prints claim create → Ready latency and
// the API server's requests per claim; it asserts no timing.
func TestKubeScaleKwok(t *testing.T) {
	n := 1000
	if v := os.Getenv("AGENTBOX_KUBE_SCALE_CLAIMS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < scalePools {
			t.Fatalf("AGENTBOX_KUBE_SCALE_CLAIMS=%q: want a number of claims, at least %d", v, scalePools)
		}
	}
	rate := 75.0 // agent-sandbox's kwok presubmit: 75 claims/s
	if v := os.Getenv("AGENTBOX_KUBE_SCALE_RATE"); v != "" {
		var err error
		if rate, err = strconv.ParseFloat(v, 64); err != nil || rate <= 0 {
			t.Fatalf("AGENTBOX_KUBE_SCALE_RATE=%q: want claims per second of the continuous burst, more than 0", v)
		}
	}
	kwok := os.Getenv("AGENTBOX_KWOK")
	if kwok == "" {
		kwok = defaultKwok
	}
	if _, err := os.Stat(kwok); err != nil {
		msg := "kwok missing (" + err.Error() + "): run scripts/k8s-test-bins.sh (install-deps does)"
		if os.Getenv("AGENTBOX_REQUIRE_ROOT") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	tctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	ctx, stop := context.WithCancelCause(tctx)
	defer stop(nil)
	_, kcPath := cluster(ctx, t)
	c := fastClient(t, kcPath)

	floor := createFloor(ctx, t, c, n)
	t.Logf("floor: %d ConfigMap creates, 64 at a time, before the controller starts: %v", n, floor.Round(time.Millisecond))

	startKwok(ctx, t, stop, kwok, kcPath)
	leases(ctx, t, c)
	harness.Start(t, harness.Name(t.Name()), harness.Args("--kube-controller", "--kubeconfig", kcPath,
		"--kube-team", ns+"=default", "--kube-leader-elect", "--kube-leader-elect-namespace", "default",
		"--kube-lease-namespace", "default"))
	t.Cleanup(func() { drain(t, c) })

	// Pools sized to hold one ready member per claim.
	per := n / scalePools
	t0 := time.Now()
	for p := range scalePools {
		tpl := &extv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tpl-%d", p), Namespace: ns}}
		tpl.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "agent", Image: "base"}}
		replicas := int32(per + boolInt(p < n%scalePools))
		pool := &extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pool-%d", p), Namespace: ns}}
		pool.Spec.TemplateRef.Name = tpl.Name
		pool.Spec.Replicas = &replicas
		for _, o := range []client.Object{tpl, pool} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("create %s: %v", o.GetName(), err)
			}
		}
	}
	waitPoolsFull(ctx, t, c, n)
	t.Logf("warm pools filled: %d ready members in %v", n, time.Since(t0).Round(time.Millisecond))

	// First the continuous burst of agent-sandbox's benchmark (claims at a
	// steady rate against pools that hold one member per claim), then, once
	// the pools refilled, all claims at once (64 in flight).
	phases := []struct {
		name, prefix string
		rate         float64
	}{{"continuous burst", "burst", rate}, {"all at once", "claim", 0}}
	for _, ph := range phases {
		before := scrapeRequests(ctx, t, kcPath)
		lat, createdIn, wall := claimBurst(ctx, t, c, kcPath, ph.prefix, n, ph.rate)
		atReady := scrapeRequests(ctx, t, kcPath)
		how := "64 in flight"
		if ph.rate > 0 {
			how = fmt.Sprintf("%.0f/s", ph.rate)
		}
		t.Logf("%s: %d claims (%s) against warm pools: create → Ready p50 %v p99 %v max %v; created in %v; all Ready %v after the first create (%.1f× the floor)",
			ph.name, n, how, pctl(lat, 50), pctl(lat, 99), pctl(lat, 100), createdIn.Round(time.Millisecond), wall.Round(time.Millisecond), float64(wall)/float64(floor))
		report := func(what string, after apiCounts) {
			lines, total, writes := after.perClaim(before, n)
			t.Logf("%s: API server requests per claim, %s (every client: the test's create and watch, the controller, kwok): %.2f, writes %.2f\n\t%s",
				ph.name, what, total, writes, strings.Join(lines, "\n\t"))
			spent, secs := after.timeSpent(before)
			t.Logf("%s: API server time answering, %s: %.1f s in all (%.1f ms per claim); by verb and resource, and etcd's:\n\t%s",
				ph.name, what, secs, secs*1000/float64(n), strings.Join(spent, "\n\t"))
		}
		report("first create to all Ready", atReady)
		t0 := time.Now()
		waitPoolsFull(ctx, t, c, n)
		refilled := scrapeRequests(ctx, t, kcPath)
		t.Logf("%s: pools refilled %v after the last claim was Ready", ph.name, time.Since(t0).Round(time.Millisecond))
		report("first create to pools refilled", refilled)
		// What a claim and its replacement may cost: no read of the claim
		// or the Leases past the cache, one update of the member (its
		// adoption; it is born with its finalizer) and none of the claim
		// (it has no finalizer), none spent on a conflict.
		for _, k := range []struct {
			key  string
			most float64
		}{{"GET sandboxclaims", 0.1}, {"LIST leases", 0.1}, {"PUT sandboxes", 1.1}, {"PUT sandboxclaims", 0.1}} {
			if got := (refilled[k.key] - before[k.key]) / float64(n); got > k.most {
				t.Errorf("%s: %.2f %s requests per claim, want at most %.1f", ph.name, got, k.key, k.most)
			}
		}
	}

	t.Run("each claim adopted a distinct warm member", func(t *testing.T) {
		var claims extv1.SandboxClaimList
		if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		seen := map[string]string{}
		for _, cl := range claims.Items {
			name := cl.Status.SandboxStatus.Name
			if other, dup := seen[name]; dup {
				t.Errorf("claims %s and %s both hold Sandbox %q", other, cl.Name, name)
				continue
			}
			seen[name] = cl.Name
			if len(cl.Finalizers) > 0 {
				t.Errorf("claim %s has finalizers %v, want none (its Sandbox's owner reference does their work)", cl.Name, cl.Finalizers)
			}
			var sb agentsv1.Sandbox
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
				t.Errorf("claim %s: Sandbox %q: %v", cl.Name, name, err)
				continue
			}
			switch {
			case !metav1.IsControlledBy(&sb, &cl):
				t.Errorf("claim %s: Sandbox %s is controlled by %v, not the claim", cl.Name, name, metav1.GetControllerOf(&sb))
			case sb.Labels[agentsv1.LabelLaunchType] != "warm":
				t.Errorf("claim %s: Sandbox %s launch type %q, want a warm member", cl.Name, name, sb.Labels[agentsv1.LabelLaunchType])
			case sb.Labels[agentsv1.LabelWarmPool] != "":
				t.Errorf("claim %s: Sandbox %s still labelled as a member of pool %s", cl.Name, name, sb.Labels[agentsv1.LabelWarmPool])
			case cl.Status.SandboxStatus.SandboxID == "" || cl.Status.SandboxStatus.SandboxID != sb.Status.SandboxID:
				t.Errorf("claim %s: sandboxID %q, Sandbox %s has %q", cl.Name, cl.Status.SandboxStatus.SandboxID, name, sb.Status.SandboxID)
			}
		}
		if len(seen) != len(phases)*n {
			t.Errorf("%d claims hold %d Sandboxes, want %d", len(claims.Items), len(seen), len(phases)*n)
		}
	})

	t.Run("pools refill", func(t *testing.T) {
		// A full pool's status comes after its creates: the count is exact
		// at once, and a claim that took a second member leaves one over.
		if got, want := countSandboxes(ctx, c), (len(phases)+1)*n; got != want {
			t.Errorf("%d Sandboxes, want %d claimed plus %d pooled", got, len(phases)*n, n)
		}
	})

	t.Run("deleting the claims removes their Sandboxes, deleting the pools the rest", func(t *testing.T) {
		t0 := time.Now()
		// One deletecollection of 1,000 claims can outlast the API server's
		// 60 s request timeout on a loaded host (the stream is reset while
		// the deletion goes on): send it again until one call completes.
		deleteAll := func(obj client.Object) {
			t.Helper()
			var err error
			for range 5 {
				if err = c.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err == nil {
					return
				}
				t.Logf("delete %T collection: %v; sending it again", obj, err)
			}
			t.Fatal(err)
		}
		deleteAll(&extv1.SandboxClaim{})
		waitFor(ctx, t, "claims and their Sandboxes to go", func() (bool, string) {
			var claims extv1.SandboxClaimList
			if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			got := countSandboxes(ctx, c)
			return len(claims.Items) == 0 && got == n, fmt.Sprintf("%d claims, %d Sandboxes (want 0 and the %d pool members)", len(claims.Items), got, n)
		})
		t.Logf("%d claims and their Sandboxes deleted in %v", len(phases)*n, time.Since(t0).Round(time.Millisecond))
		for _, o := range []client.Object{&extv1.SandboxWarmPool{}, &extv1.SandboxTemplate{}} {
			deleteAll(o)
		}
		waitFor(ctx, t, "nothing left", func() (bool, string) {
			var pools extv1.SandboxWarmPoolList
			if err := c.List(ctx, &pools, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			got := countSandboxes(ctx, c)
			return len(pools.Items) == 0 && got == 0, fmt.Sprintf("%d pools, %d Sandboxes", len(pools.Items), got)
		})
	})
}

// createFloor is how long n creates of a small object take against this API
// server with nothing else running: what n claims cost at the least.
func createFloor(ctx context.Context, t *testing.T, c client.Client, n int) time.Duration {
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "floor"}}
	if err := c.Create(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	errs := make(chan error, n)
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: claimName(i), Namespace: "floor"}, Data: map[string]string{"k": "v"}}
			if err := c.Create(ctx, cm); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	d := time.Since(t0)
	close(errs)
	for err := range errs {
		t.Fatalf("floor: create ConfigMap: %v", err)
	}
	if err := c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace("floor")); err != nil {
		t.Fatal(err)
	}
	return d
}

func claimName(i int) string { return fmt.Sprintf("claim-%04d", i) }

// claimBurst creates n claims named PREFIX-NNNN spread over the pools, at
// rate a second (0: 64 in flight at once), and waits until all are Ready. It
// returns each claim's create → Ready latency, how long the creates took and
// the time from the first create to the last Ready.
func claimBurst(ctx context.Context, t *testing.T, c client.Client, kcPath, prefix string, n int, rate float64) (lat []time.Duration, createdIn, wall time.Duration) {
	t.Helper()
	name := func(i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }
	// Watch before creating, so no Ready transition is missed.
	ready := watchReady(ctx, t, kcPath, prefix+"-", n)
	created := make([]time.Time, n)
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	errs := make(chan error, n)
	for i := range n {
		if rate > 0 {
			// Paces the load as agent-sandbox's qpsLoad does.
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cl := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: name(i), Namespace: ns}}
			cl.Spec.WarmPoolRef.Name = fmt.Sprintf("pool-%d", i%scalePools)
			created[i] = time.Now()
			if err := c.Create(ctx, cl); err != nil {
				errs <- fmt.Errorf("create claim %s: %w", cl.Name, err)
			}
		})
	}
	wg.Wait()
	createdIn = time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := <-ready
	if got.err != nil {
		t.Fatalf("waiting for every claim to be Ready: %v", got.err)
	}
	lat = make([]time.Duration, n)
	for i := range n {
		lat[i] = got.at[name(i)].Sub(created[i])
		wall = max(wall, got.at[name(i)].Sub(start))
	}
	return lat, createdIn, wall
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func pctl(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(time.Millisecond)
}

// fastClient is a typed client without client-go's default rate limit (5
// requests/s), so the test's own requests do not pace the controller.
func fastClient(t *testing.T, kcPath string) client.WithWatch {
	cfg, err := clientcmd.BuildConfigFromFlags("", kcPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 2000, 4000
	scheme, err := kubectl.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startKwok runs kwok with the Sandbox stages until the test ends; if kwok
// exits first, it stops the test with the reason.
func startKwok(ctx context.Context, t *testing.T, stop context.CancelCauseFunc, bin, kcPath string) {
	// kwok reads the API's discovery and OpenAPI once at start and exits
	// when a group is missing; the CRDs were only just established.
	cfg0, err := clientcmd.BuildConfigFromFlags("", kcPath)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the agent-sandbox API groups in discovery", func() (bool, string) {
		if _, _, err := disc.ServerGroupsAndResources(); err != nil {
			return false, err.Error()
		}
		paths, err := disc.OpenAPIV3().Paths()
		if err != nil {
			return false, err.Error()
		}
		_, ok := paths["apis/"+sandboxGVK.GroupVersion().String()]
		return ok, "no OpenAPI v3 path for " + sandboxGVK.GroupVersion().String()
	})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "stages.yaml")
	if err := os.WriteFile(cfg, []byte(kwokStages()), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "kwok.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kcPath, "--config", cfg, "--manage-single-node", "kwok-no-such-node")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kwok: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(exited)
		stop(fmt.Errorf("kwok exited (%v); its log: %s", err, logf.Name()))
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kwok log (last 4 KiB):\n%s", b[max(len(b)-4096, 0):])
		}
	})
}

// leases writes the node agent Leases of the kwok nodes, as live agents
// with room for every Sandbox; they last the whole test.
func leases(ctx context.Context, t *testing.T, c client.Client) {
	for i := range kwokNodes {
		node := fmt.Sprintf("kwok-node-%d", i)
		st, err := json.Marshal(kubectl.NodeStatus{Node: node, CPU: 4096, MemoryMB: 4 << 20, FreeCPU: 4096, FreeMemoryMB: 4 << 20,
			Tiers: []string{"container", "gvisor", "microvm"}, Templates: []string{"base"}})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.NewMicroTime(time.Now())
		secs := int32(3600)
		l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: kubectl.LeasePrefix + node, Namespace: "default",
			Labels:      map[string]string{kubectl.LabelNodeAgent: "true", kubectl.LabelNode: node},
			Annotations: map[string]string{kubectl.AnnotationNodeStatus: string(st)}}}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &node, &secs, &now, &now
		if err := c.Create(ctx, l); err != nil {
			t.Fatalf("create lease for %s: %v", node, err)
		}
	}
}

// waitPoolsFull waits until the pools report n ready members in all, as
// long as their ready count keeps moving (a loaded host refills slowly).
func waitPoolsFull(ctx context.Context, t *testing.T, c client.Client, n int) {
	t.Helper()
	last, moved := -1, time.Now()
	for {
		var pools extv1.SandboxWarmPoolList
		ready, state, full := 0, "", false
		if err := c.List(ctx, &pools, client.InNamespace(ns)); err != nil {
			state = err.Error()
		} else {
			full = len(pools.Items) == scalePools
			for _, p := range pools.Items {
				ready += int(p.Status.ReadyReplicas)
				full = full && p.Status.ReadyReplicas == *p.Spec.Replicas && p.Status.Replicas == *p.Spec.Replicas
				state += fmt.Sprintf("%s %d/%d ready; ", p.Name, p.Status.ReadyReplicas, *p.Spec.Replicas)
			}
		}
		if full && ready == n {
			return
		}
		if ready != last {
			last, moved = ready, time.Now()
		}
		if time.Since(moved) > waitLimit || ctx.Err() != nil {
			t.Fatalf("waiting for full warm pools: no progress in %v (%v); last state: %s", waitLimit, ctx.Err(), state)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func countSandboxes(ctx context.Context, c client.Client) int {
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return -1
	}
	return len(list.Items)
}

// watchReady records when each claim named prefix* is first seen Ready; it
// sends the times once n claims are Ready, or an error when ctx ends first.
func watchReady(ctx context.Context, t *testing.T, kcPath, prefix string, n int) <-chan readyTimes {
	c := fastClient(t, kcPath)
	out := make(chan readyTimes, 1)
	started := make(chan struct{})
	go func() {
		at := map[string]time.Time{}
		once := sync.OnceFunc(func() { close(started) })
		for ctx.Err() == nil {
			w, err := c.Watch(ctx, &extv1.SandboxClaimList{}, client.InNamespace(ns))
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			once()
			for ev := range w.ResultChan() {
				cl, ok := ev.Object.(*extv1.SandboxClaim)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				if _, seen := at[cl.Name]; !seen && strings.HasPrefix(cl.Name, prefix) && meta.IsStatusConditionTrue(cl.Status.Conditions, agentsv1.ConditionReady) {
					at[cl.Name] = time.Now()
					if len(at) == n {
						w.Stop()
						out <- readyTimes{at: at}
						return
					}
				}
			}
		}
		out <- readyTimes{err: fmt.Errorf("%d of %d claims Ready: %w", len(at), n, context.Cause(ctx))}
	}()
	select {
	case <-started:
	case <-ctx.Done():
	}
	return out
}

type readyTimes struct {
	at  map[string]time.Time
	err error
}
