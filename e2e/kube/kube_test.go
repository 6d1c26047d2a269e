// Package kube tests `agentbox serve --kube-controller` against a real
// kube-apiserver and etcd (envtest, binaries built by
// scripts/k8s-test-bins.sh): agent-sandbox manifests become sandboxes of the
// server that run commands through its gateway.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// defaultAssets is where scripts/k8s-test-bins.sh puts etcd and
// kube-apiserver.
const defaultAssets = "/var/cache/agentbox/k8s-bin/etcd-v3.6.16-kube-apiserver-v1.37.0"

const ns = "agents"

// The manifests as written for agent-sandbox: only the image names an
// agentbox template.
const manifests = `
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: python
  namespace: agents
spec:
  podTemplate:
    spec:
      runtimeClassName: runc
      containers:
      - name: agent
        image: base
        workingDir: /tmp
        env:
        - name: FROM_TEMPLATE
          value: tpl-value
        resources:
          limits:
            cpu: "1"
            memory: 512Mi
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: python-pool
  namespace: agents
spec:
  replicas: 1
  sandboxTemplateRef:
    name: python
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata:
  name: my-claim
  namespace: agents
spec:
  warmPoolRef:
    name: python-pool
`

func assets(t *testing.T) string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = defaultAssets
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			msg := "envtest binaries missing (" + err.Error() + "): run scripts/k8s-test-bins.sh (install-deps does)"
			if os.Getenv("AGENTBOX_REQUIRE_ROOT") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return dir
}

func decode(t *testing.T, docs string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(docs, "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("manifest: %v", err)
		}
		out = append(out, u)
	}
	return out
}

var (
	claimGVK   = schema.GroupVersionKind{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxClaim"}
	sandboxGVK = schema.GroupVersionKind{Group: "agents.x-k8s.io", Version: "v1beta1", Kind: "Sandbox"}
)

func get(ctx context.Context, c client.Client, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u)
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var conds []metav1.Condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		s, _ := m["type"].(string)
		st, _ := m["status"].(string)
		rs, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		conds = append(conds, metav1.Condition{Type: s, Status: metav1.ConditionStatus(st), Reason: rs, Message: msg})
	}
	return meta.FindStatusCondition(conds, typ)
}

// waitFor polls f until it returns true, failing the test when the context
// ends or after waitLimit, so a stuck step is reported with its last state
// long before the test's own deadline.
func waitFor(ctx context.Context, t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeoutCause(ctx, waitLimit, fmt.Errorf("not done in %s", waitLimit))
	defer cancel()
	last := ""
	for {
		ok, state := f()
		if ok {
			return
		}
		last = state
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; last state: %s", what, context.Cause(ctx), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitLimit bounds one waitFor: every step of these tests takes seconds,
// the scale test's burst of claims about half a minute.
const waitLimit = 3 * time.Minute

// cluster starts a kube-apiserver and etcd with the CRDs installed and
// the namespace made; it returns a client and an admin kubeconfig file.
func cluster(ctx context.Context, t *testing.T) (client.Client, string) {
	dir := assets(t)
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{filepath.Join(harness.RepoRoot(t), "deploy", "k8s", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest start: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "agentbox-controller", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	if err := c.Create(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	return c, kcPath
}

func TestKubeController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	s := harness.Start(t, harness.Args("--kube-controller", "--kubeconfig", kcPath, "--kube-node", "node-a", "--kube-team", ns+"=default",
		"--kube-metrics-listen", metricsAddr, "--kube-lease-namespace", "default"))
	// Before the server's teardown: pools and claims go first, so the
	// controller makes no sandbox while the teardown kills them.
	t.Cleanup(func() { drain(t, c) })
	sdk := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))

	t.Run("invalid specs are refused naming the field", func(t *testing.T) {
		for _, tc := range []struct{ doc, field string }{
			{`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: bad-pool, namespace: agents}
spec: {replicas: -1, sandboxTemplateRef: {name: python}}`, "spec.replicas"},
			{`apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {name: bad-sandbox, namespace: agents}
spec:
  podTemplate:
    spec:
      containers: [{name: a}]`, "containers[0].image"},
			{`apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: bad-template, namespace: agents}
spec:
  podTemplate:
    spec:
      containers: [{name: a, image: ""}]`, "containers[0].image"},
			{`apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {name: bad-mode, namespace: agents}
spec:
  operatingMode: Sleeping
  podTemplate:
    spec:
      containers: [{name: a, image: base}]`, "spec.operatingMode"},
		} {
			obj := decode(t, tc.doc)[0]
			err := c.Create(ctx, obj)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("create %s %s: err = %v, want a refusal naming %s", obj.GetKind(), obj.GetName(), err, tc.field)
			}
		}
	})

	t.Run("claim for a missing pool or template says so", func(t *testing.T) {
		for _, doc := range decode(t, `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: lost-claim, namespace: agents}
spec: {warmPoolRef: {name: no-such-pool}}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: orphan-pool, namespace: agents}
spec: {replicas: 0, sandboxTemplateRef: {name: no-such-template}}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: orphan-claim, namespace: agents}
spec: {warmPoolRef: {name: orphan-pool}}`) {
			if err := c.Create(ctx, doc); err != nil {
				t.Fatal(err)
			}
		}
		for name, want := range map[string][2]string{
			"lost-claim":   {"WarmPoolNotFound", `"no-such-pool"`},
			"orphan-claim": {"TemplateNotFound", `"no-such-template"`},
		} {
			waitFor(ctx, t, name+" condition", func() (bool, string) {
				u, err := get(ctx, c, claimGVK, name)
				if err != nil {
					return false, err.Error()
				}
				cond := condition(u, "Ready")
				if cond == nil {
					return false, "no Ready condition"
				}
				return cond.Status == metav1.ConditionFalse && cond.Reason == want[0] && strings.Contains(cond.Message, want[1]), cond.Reason + ": " + cond.Message
			})
		}
	})

	var claimed, sandboxID string
	t.Run("template, warm pool and claim give a ready sandbox reachable through the gateway", func(t *testing.T) {
		objs := decode(t, manifests)
		// The pool first, alone: the claim must adopt its ready member.
		for _, o := range objs[:2] {
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("create %s: %v", o.GetKind(), err)
			}
		}
		waitFor(ctx, t, "a ready pool member", func() (bool, string) {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
			if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"agents.x-k8s.io/warm-pool-sandbox": "python-pool"}); err != nil {
				return false, err.Error()
			}
			for _, u := range list.Items {
				if cond := condition(&u, "Ready"); cond != nil && cond.Status == metav1.ConditionTrue {
					return true, ""
				}
			}
			return false, "members: " + func() string {
				var b strings.Builder
				for _, u := range list.Items {
					if cond := condition(&u, "Ready"); cond != nil {
						b.WriteString(u.GetName() + "=" + cond.Reason + ": " + cond.Message + "; ")
					}
				}
				return b.String()
			}()
		})
		claimStart := time.Now()
		if err := c.Create(ctx, objs[2]); err != nil {
			t.Fatalf("create claim: %v", err)
		}
		waitFor(ctx, t, "claim Ready", func() (bool, string) {
			u, err := get(ctx, c, claimGVK, "my-claim")
			if err != nil {
				return false, err.Error()
			}
			cond := condition(u, "Ready")
			if cond == nil || cond.Status != metav1.ConditionTrue {
				return false, fmtCond(cond)
			}
			claimed, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "name")
			sandboxID, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "sandboxID")
			return sandboxID != "", "no sandboxID yet"
		})
		// Informational, never asserted: the bench owns timings.
		t.Logf("claim to Ready (warm adoption): %v", time.Since(claimStart))
		sb, err := get(ctx, c, sandboxGVK, claimed)
		if err != nil {
			t.Fatal(err)
		}
		if lt := sb.GetLabels()["agents.x-k8s.io/launch-type"]; lt != "warm" {
			t.Errorf("claimed Sandbox %s has launch-type %q, want warm (adopted from the pool)", claimed, lt)
		}
		if node, _, _ := unstructured.NestedString(sb.Object, "status", "nodeName"); node != "node-a" {
			t.Errorf("status.nodeName = %q, want node-a", node)
		}
		sbx, err := sdk.Connect(ctx, sandboxID, 10*time.Minute)
		if err != nil {
			t.Fatalf("connect to %s through the API: %v", sandboxID, err)
		}
		res, err := sbx.Commands.Run(ctx, `echo "$FROM_TEMPLATE $(pwd)"`)
		if err != nil {
			t.Fatalf("run a command through the gateway: %v", err)
		}
		if got := strings.TrimSpace(res.Stdout); got != "tpl-value /tmp" {
			t.Errorf("command output %q, want the template's env and workingDir: %q", got, "tpl-value /tmp")
		}
		// The container's resource limits became the sandbox's.
		st, body, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+sandboxID, nil)
		if err != nil || st != http.StatusOK {
			t.Fatalf("GET /sandboxes/%s: %d %s %v", sandboxID, st, body, err)
		}
		var info struct {
			CPUCount int `json:"cpuCount"`
			MemoryMB int `json:"memoryMB"`
		}
		if err := json.Unmarshal(body, &info); err != nil || info.CPUCount != 1 || info.MemoryMB != 512 {
			t.Errorf("sandbox limits %s (%v), want cpuCount 1 and memoryMB 512 from resources.limits", body, err)
		}
		// The pool replenishes the member the claim took.
		waitFor(ctx, t, "the pool to replenish", func() (bool, string) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(schema.GroupVersionKind{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxWarmPool"})
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "python-pool"}, u); err != nil {
				return false, err.Error()
			}
			ready, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
			return ready == 1, "readyReplicas not 1"
		})
	})

	t.Run("events and Prometheus metrics", func(t *testing.T) {
		if claimed == "" {
			t.Skip("no claim was served")
		}
		events := &unstructured.UnstructuredList{}
		events.SetGroupVersionKind(schema.GroupVersionKind{Group: "events.k8s.io", Version: "v1", Kind: "EventList"})
		waitFor(ctx, t, "an Adopted event on the claim", func() (bool, string) {
			if err := c.List(ctx, events, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			for _, e := range events.Items {
				reason, _, _ := unstructured.NestedString(e.Object, "reason")
				kind, _, _ := unstructured.NestedString(e.Object, "regarding", "kind")
				if reason == "Adopted" && kind == "SandboxClaim" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events, none Adopted", len(events.Items))
		})
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, c := range []string{"sandbox", "sandboxclaim", "sandboxwarmpool"} {
			if want := `controller_runtime_reconcile_total{controller="` + c + `",result="success"}`; !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("Suspended pauses with memory kept, Running resumes", func(t *testing.T) {
		// The floor: the same template created through the E2B API.
		floorStart := time.Now()
		floor, err := sdk.Create(ctx, agentbox.CreateOptions{Template: "base", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		floorTook := time.Since(floorStart)
		_ = floor.Kill(ctx)
		coldStart := time.Now()
		if err := c.Create(ctx, decode(t, direct)[0]); err != nil {
			t.Fatal(err)
		}
		id := waitReady(ctx, t, c, "direct")
		coldTook := time.Since(coldStart)
		t.Logf("Sandbox object to Ready (cold): %v; E2B API create floor: %v; ratio %.2f", coldTook, floorTook, coldTook.Seconds()/floorTook.Seconds())
		sbx, err := sdk.Connect(ctx, id, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// A process that only a kept memory image brings back.
		if _, err := sbx.Commands.Run(ctx, `sleep 600 >/dev/null 2>&1 & echo $! > /tmp/sleeper`); err != nil {
			t.Fatal(err)
		}
		mode(ctx, t, c, "direct", "Suspended")
		waitFor(ctx, t, "Suspended=True", func() (bool, string) {
			u, err := get(ctx, c, sandboxGVK, "direct")
			if err != nil {
				return false, err.Error()
			}
			sc, rc := condition(u, "Suspended"), condition(u, "Ready")
			return sc != nil && sc.Status == metav1.ConditionTrue && rc != nil && rc.Reason == "SandboxSuspended", fmtCond(sc) + " / " + fmtCond(rc)
		})
		if got := apiState(ctx, t, s, id); got != "paused" {
			t.Errorf("E2B state of the suspended sandbox = %q, want paused", got)
		}
		mode(ctx, t, c, "direct", "Running")
		if got := waitReady(ctx, t, c, "direct"); got != id {
			t.Errorf("resumed as sandbox %s, want the same %s", got, id)
		}
		res, err := sbx.Commands.Run(ctx, `kill -0 "$(cat /tmp/sleeper)" && echo alive`)
		if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
			t.Errorf("the process started before the suspension: %v %+v", err, res)
		}
	})

	t.Run("shutdownTime with Retain expires the sandbox and keeps the object", func(t *testing.T) {
		u := decode(t, direct)[0]
		u.SetName("short")
		if err := unstructured.SetNestedField(u.Object, time.Now().Add(4*time.Second).UTC().Format(time.RFC3339), "spec", "shutdownTime"); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		id := waitReady(ctx, t, c, "short")
		waitFor(ctx, t, "Ready=False SandboxExpired", func() (bool, string) {
			u, err := get(ctx, c, sandboxGVK, "short")
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			return rc != nil && rc.Reason == "SandboxExpired", fmtCond(rc)
		})
		if got := apiState(ctx, t, s, id); got != "" {
			t.Errorf("expired sandbox %s is still %q", id, got)
		}
	})

	t.Run("a template edit replaces stale pool members (Recreate)", func(t *testing.T) {
		old := poolMembers(ctx, t, c)
		if len(old) == 0 {
			t.Fatal("the pool has no member")
		}
		patch(ctx, t, c, schema.GroupVersionKind{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxWarmPool"}, "python-pool",
			`{"spec":{"updateStrategy":{"type":"Recreate"}}}`)
		patch(ctx, t, c, schema.GroupVersionKind{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxTemplate"}, "python",
			`{"spec":{"podTemplate":{"spec":{"containers":[{"name":"agent","image":"base","env":[{"name":"FROM_TEMPLATE","value":"v2"}]}]}}}}`)
		waitFor(ctx, t, "a fresh ready member in place of the stale ones", func() (bool, string) {
			now := poolMembers(ctx, t, c)
			for name := range old {
				if _, still := now[name]; still {
					return false, "stale member " + name + " still there"
				}
			}
			for _, ready := range now {
				if ready {
					return true, ""
				}
			}
			return false, fmt.Sprintf("members %v", now)
		})
	})

	t.Run("deleting the claim kills its sandbox", func(t *testing.T) {
		if sandboxID == "" {
			t.Skip("no claimed sandbox")
		}
		u, err := get(ctx, c, claimGVK, "my-claim")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, u); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the claim's Sandbox object to go", func() (bool, string) {
			_, err := get(ctx, c, sandboxGVK, claimed)
			return client.IgnoreNotFound(err) == nil && err != nil, "Sandbox " + claimed + " still there"
		})
		_, err = sdk.Connect(ctx, sandboxID, time.Minute)
		var apiErr *agentbox.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.Status != 404 {
			t.Errorf("connect to killed sandbox %s: err = %v, want 404", sandboxID, err)
		}
	})
}

// direct is a Sandbox made without template or claim.
const direct = `apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {name: direct, namespace: agents}
spec:
  podTemplate:
    spec:
      containers: [{name: agent, image: base}]`

// waitReady waits for the Sandbox's Ready condition and returns its id.
func waitReady(ctx context.Context, t *testing.T, c client.Client, name string) string {
	t.Helper()
	var id string
	waitFor(ctx, t, name+" Ready", func() (bool, string) {
		u, err := get(ctx, c, sandboxGVK, name)
		if err != nil {
			return false, err.Error()
		}
		rc := condition(u, "Ready")
		id, _, _ = unstructured.NestedString(u.Object, "status", "sandboxID")
		return rc != nil && rc.Status == metav1.ConditionTrue && id != "", fmtCond(rc)
	})
	return id
}

func patch(ctx context.Context, t *testing.T, c client.Client, gvk schema.GroupVersionKind, name, merge string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	if err := c.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(merge))); err != nil {
		t.Fatalf("patch %s %s: %v", gvk.Kind, name, err)
	}
}

func mode(ctx context.Context, t *testing.T, c client.Client, name, m string) {
	t.Helper()
	patch(ctx, t, c, sandboxGVK, name, `{"spec":{"operatingMode":"`+m+`"}}`)
}

// apiState is the sandbox's state in the E2B API ("" when it is gone).
func apiState(ctx context.Context, t *testing.T, s *harness.Server, id string) string {
	t.Helper()
	st, body, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st == http.StatusNotFound {
		return ""
	}
	var info struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatalf("GET /sandboxes/%s: %d %s", id, st, body)
	}
	return info.State
}

// poolMembers maps python-pool's unclaimed members to their readiness.
func poolMembers(ctx context.Context, t *testing.T, c client.Client) map[string]bool {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
	if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"agents.x-k8s.io/warm-pool-sandbox": "python-pool"}); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, u := range list.Items {
		if u.GetDeletionTimestamp() != nil {
			continue
		}
		rc := condition(&u, "Ready")
		out[u.GetName()] = rc != nil && rc.Status == metav1.ConditionTrue
	}
	return out
}

func fmtCond(c *metav1.Condition) string {
	if c == nil {
		return "no Ready condition"
	}
	return string(c.Status) + " " + c.Reason + ": " + c.Message
}

// drain deletes every pool, claim and Sandbox of the namespace and waits
// until the controller has killed their sandboxes (its finalizers go).
func drain(t *testing.T, c client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, kind := range []schema.GroupVersionKind{
		{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxWarmPool"},
		claimGVK, sandboxGVK,
	} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kind)
		if err := c.DeleteAllOf(ctx, u, client.InNamespace(ns)); err != nil {
			t.Errorf("delete %ss: %v", kind.Kind, err)
		}
	}
	waitFor(ctx, t, "every Sandbox object to go", func() (bool, string) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})
}

// TestKubeTwoNodes runs two servers as the node agents of two nodes with
// different capacity and tiers: placement follows free capacity and the
// tier a Sandbox asks for, each Sandbox runs on its node's agent only, and
// killing one agent marks its Sandboxes NodeLost while the other node's
// stay Ready.
func TestKubeTwoNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)
	agent := func(node string, extra ...string) *harness.Server {
		return harness.Start(t, harness.Name(t.Name()+"-"+node), harness.Args(append([]string{"--kube-controller", "--kubeconfig", kcPath,
			"--kube-node", node, "--kube-team", ns + "=default", "--kube-leader-elect", "--kube-leader-elect-namespace", "default",
			"--kube-lease-namespace", "default", "--kube-lease-duration", "3s"}, extra...)...))
	}
	// node-a is small but runs gVisor; node-b is big and cannot (no runsc).
	servers := map[string]*harness.Server{
		"node-a": agent("node-a", "--kube-node-cpu", "4", "--kube-node-memory-mb", "4096"),
		"node-b": agent("node-b", "--kube-node-cpu", "16", "--kube-node-memory-mb", "32768", "--runsc", "/nonexistent/runsc"),
	}
	t.Cleanup(func() { drain(t, c) })

	t.Run("each agent reports itself on its Lease", func(t *testing.T) {
		for node, tiers := range map[string]string{"node-a": "gvisor", "node-b": ""} {
			var st struct {
				CPU              int               `json:"cpu"`
				FreeMemoryMB     int               `json:"freeMemoryMB"`
				Tiers            []string          `json:"tiers"`
				UnavailableTiers map[string]string `json:"unavailableTiers"`
				Templates        []string          `json:"templates"`
			}
			waitFor(ctx, t, "the Lease of "+node, func() (bool, string) {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"})
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "agentbox-node-" + node}, u); err != nil {
					return false, err.Error()
				}
				raw := u.GetAnnotations()["agentbox.dev/node-status"]
				return json.Unmarshal([]byte(raw), &st) == nil && u.GetLabels()["agentbox.dev/node-agent"] == "true", raw
			})
			hasGVisor := strings.Contains(strings.Join(st.Tiers, ","), "gvisor")
			if (tiers == "gvisor") != hasGVisor {
				t.Errorf("%s reports tiers %v (unavailable %v)", node, st.Tiers, st.UnavailableTiers)
			}
			if tiers == "" && st.UnavailableTiers["gvisor"] == "" {
				t.Errorf("%s does not say why it cannot run gvisor: %v", node, st.UnavailableTiers)
			}
			if !strings.Contains(strings.Join(st.Templates, ","), "base") {
				t.Errorf("%s reports templates %v, want base among them", node, st.Templates)
			}
			if want := map[string]int{"node-a": 4, "node-b": 16}[node]; st.CPU != want {
				t.Errorf("%s reports %d CPUs, want %d (--kube-node-cpu)", node, st.CPU, want)
			}
		}
	})

	// Two plain Sandboxes go to the node with more free capacity; the one
	// asking for gVisor goes to the only node that runs it.
	want := map[string]string{"s1": "node-b", "s2": "node-b", "g1": "node-a"}
	for _, n := range []string{"s1", "s2", "g1"} {
		u := decode(t, direct)[0]
		u.SetName(n)
		if n == "g1" {
			if err := unstructured.SetNestedField(u.Object, "gvisor", "spec", "podTemplate", "spec", "runtimeClassName"); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	type placed struct{ node, id string }
	where := map[string]placed{}
	for n, wantNode := range want {
		id := waitReady(ctx, t, c, n)
		u, err := get(ctx, c, sandboxGVK, n)
		if err != nil {
			t.Fatal(err)
		}
		node, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
		if node != wantNode {
			t.Errorf("Sandbox %s is on node %q, want %s", n, node, wantNode)
		}
		s, ok := servers[node]
		if !ok {
			t.Fatalf("Sandbox %s is on node %q, want node-a or node-b", n, node)
		}
		where[n] = placed{node, id}
		// Its node's agent runs it, and no other agent knows it.
		if got := apiState(ctx, t, s, id); got != "running" {
			t.Errorf("Sandbox %s (%s) on %s: state %q, want running", n, id, node, got)
		}
		for other, os := range servers {
			if other != node && apiState(ctx, t, os, id) != "" {
				t.Errorf("Sandbox %s (%s) of %s also exists on %s", n, id, node, other)
			}
		}
	}
	t.Logf("placement: %v", where)

	servers["node-b"].Kill9(t)
	for n, p := range where {
		if p.node != "node-b" {
			continue
		}
		waitFor(ctx, t, n+" NodeLost", func() (bool, string) {
			u, err := get(ctx, c, sandboxGVK, n)
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			node, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
			return rc != nil && rc.Status == metav1.ConditionFalse && rc.Reason == "NodeLost" && strings.Contains(rc.Message, "node-b") && node == "node-b",
				fmtCond(rc) + " on " + node
		})
	}
	a := servers["node-a"]
	sdk := agentbox.New(agentbox.WithAPIURL(a.URL), agentbox.WithSandboxURL(a.URL), agentbox.WithAPIKey(a.APIKey))
	for n, p := range where {
		if p.node != "node-a" {
			continue
		}
		sbx, err := sdk.Connect(ctx, p.id, 10*time.Minute)
		if err != nil {
			t.Fatalf("connect to %s on node-a after node-b died: %v", n, err)
		}
		if res, err := sbx.Commands.Run(ctx, "echo up"); err != nil || strings.TrimSpace(res.Stdout) != "up" {
			t.Errorf("command in %s on node-a after node-b died: %v %+v", n, err, res)
		}
		if u, err := get(ctx, c, sandboxGVK, n); err != nil || condition(u, "Ready") == nil || condition(u, "Ready").Status != metav1.ConditionTrue {
			t.Errorf("Sandbox %s on node-a is no longer Ready after node-b died: %v", n, err)
		}
	}
	// node-b comes back: its agent reconciles its Sandboxes (no longer
	// NodeLost) and releases them in the cleanup.
	servers["node-b"].Launch(t)
	for n, p := range where {
		if p.node != "node-b" {
			continue
		}
		waitFor(ctx, t, n+" reconciled by the returning agent", func() (bool, string) {
			u, err := get(ctx, c, sandboxGVK, n)
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			return rc != nil && rc.Reason != "NodeLost", fmtCond(rc)
		})
	}
}
