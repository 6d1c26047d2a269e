package kube

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// The manifests of the conformance test: an agent-sandbox template, warm
// pool and claim in team A's namespace.
const teamAManifests = `
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python, namespace: team-a}
spec:
  podTemplate:
    spec:
      containers:
      - name: agent
        image: base
        env: [{name: FROM_TEMPLATE, value: tpl-value}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-pool, namespace: team-a}
spec:
  replicas: 1
  sandboxTemplateRef: {name: python}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: manifest-claim, namespace: team-a}
spec:
  warmPoolRef: {name: python-pool}
`

// apiReplica is a running `agentbox serve --kubernetes`.
type apiReplica struct {
	URL string
	cmd *exec.Cmd
	log string
}

// startReplica runs serve --kubernetes as nobody (it needs no privilege):
// its kubeconfig and token secret are copied into a directory of its own;
// extra are further serve flags.
func startReplica(t *testing.T, bin, kubeconfig, secret string, extra ...string) *apiReplica {
	t.Helper()
	// Traversable by nobody (t.TempDir's parent is private to root).
	dir, err := os.MkdirTemp("", "agentbox-e2e-replica-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "replica")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	for _, f := range []struct{ src, dst string }{{kubeconfig, "kubeconfig"}, {secret, "token-secret"}} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, f.dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(home, f.dst), nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := &apiReplica{URL: "http://" + addr, log: filepath.Join(dir, "replica.log")}
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(bin, append([]string{"serve", "--kubernetes", "--kubeconfig", filepath.Join(home, "kubeconfig"),
		"--token-secret-file", filepath.Join(home, "token-secret"), "--listen", addr,
		"--kube-lease-namespace", "agentbox-system", "--kube-keys-namespace", "agentbox-system"}, extra...)...)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		_ = r.cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("----- serve --kubernetes log -----\n%s", replicaLogTail(string(b), 80))
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(r.URL + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(r.log)
			t.Fatalf("serve --kubernetes not ready: %v\n%s", err, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func replicaLogTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var kubeKeyOutput = regexp.MustCompile(`e2b_[0-9a-f]{40}`)

// mintKubeKey mints a key of team with `agentbox apikey create --kubernetes`.
func mintKubeKey(t *testing.T, bin, kubeconfig, team string) string {
	t.Helper()
	out, err := exec.Command(bin, "apikey", "create", "--kubernetes", "--team", team, "--kubeconfig", kubeconfig,
		"--kube-keys-namespace", "agentbox-system").CombinedOutput()
	if err != nil {
		t.Fatalf("apikey create --kubernetes: %v\n%s", err, out)
	}
	k := kubeKeyOutput.FindString(string(out))
	if k == "" {
		t.Fatalf("apikey create --kubernetes printed no key: %s", out)
	}
	return k
}

func createTeamNamespace(ctx context.Context, t *testing.T, c client.Client, name string, labels map[string]any) {
	t.Helper()
	md := map[string]any{"name": name}
	if labels != nil {
		md["labels"] = labels
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": md}}
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
}

// nodeOfSandboxID is the node of the Sandbox labelled with sandbox id.
func nodeOfSandboxID(ctx context.Context, c client.Client, id string) (string, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
	if err := c.List(ctx, list, client.MatchingLabels{"agentbox.dev/sandbox-id": id}); err != nil {
		return "", err
	}
	if len(list.Items) != 1 {
		return "", fmt.Errorf("%d Sandboxes labelled agentbox.dev/sandbox-id=%s", len(list.Items), id)
	}
	n, _, _ := unstructured.NestedString(list.Items[0].Object, "status", "nodeName")
	return n, nil
}

// TestKubeAPIConformance runs the official e2b JS SDK against `serve
// --kubernetes` in front of two node agents sharing a token secret, checks
// tenant isolation through it, reaches a manifest-made claim's sandbox
// through its data plane, and keeps serving one node's sandboxes after the
// other node's agent dies.
func TestKubeAPIConformance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, kcPath, secret := teamCluster(ctx, t)
	// No --kube-team: the agents bind the team-labelled namespaces.
	agent := func(node string) *harness.Server {
		return harness.Start(t, harness.Name(t.Name()+"-"+node), harness.Args("--kube-controller", "--kubeconfig", kcPath,
			"--kube-node", node, "--kube-leader-elect", "--kube-leader-elect-namespace", "default",
			"--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret))
	}
	agents := map[string]*harness.Server{"node-a": agent("node-a"), "node-b": agent("node-b")}
	t.Cleanup(func() {
		for _, a := range agents {
			if a.ProcessState() != nil {
				a.Launch(t) // its finalizers need it back
			}
		}
		drainTeamNamespaces(t, c, "team-a", "team-b")
	})
	bin := agents["node-a"].Bin
	rep := startReplica(t, bin, kcPath, secret)
	keyA, keyB := mintKubeKey(t, bin, kcPath, "team-a"), mintKubeKey(t, bin, kcPath, "team-b")

	t.Run("e2b JS SDK", func(t *testing.T) {
		jsDir := filepath.Join(harness.RepoRoot(t), "e2e", "js")
		harness.NPMInstall(t, jsDir)
		harness.SDKMatrix(t, jsDir, "e2b")
		jctx, jcancel := context.WithTimeout(ctx, 8*time.Minute)
		defer jcancel()
		cmd := exec.CommandContext(jctx, "node", "--test", "--test-reporter=spec", "cluster.mjs")
		cmd.Dir = jsDir
		cmd.Env = append(os.Environ(), "E2B_API_URL="+rep.URL, "E2B_SANDBOX_URL="+rep.URL, "E2B_API_KEY="+keyA, "E2E_OTHER_API_KEY="+keyB)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("node --test cluster.mjs failed: %v\n%s", err, out)
		}
		t.Logf("node --test cluster.mjs:\n%s", replicaLogTail(string(out), 20))
	})

	sdkA := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(keyA))

	t.Run("a manifest's claim is reachable through the replica", func(t *testing.T) {
		for _, u := range decode(t, teamAManifests) {
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		var id string
		waitFor(ctx, t, "the claim to be Ready", func() (bool, string) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(claimGVK)
			if err := c.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "manifest-claim"}, u); err != nil {
				return false, err.Error()
			}
			id, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "sandboxID")
			rc := condition(u, "Ready")
			return rc != nil && rc.Status == metav1.ConditionTrue && id != "", fmtCond(rc)
		})
		// The replica reads Sandboxes from its informer cache, which may
		// see the claimed Sandbox's id label a moment after the claim is
		// Ready: a connect right then can answer 404.
		var sbx *agentbox.Sandbox
		waitFor(ctx, t, "the replica to know the claim's sandbox "+id, func() (bool, string) {
			var err error
			sbx, err = sdkA.Connect(ctx, id, 5*time.Minute)
			return err == nil, fmt.Sprint(err)
		})
		res, err := sbx.Commands.Run(ctx, "echo $FROM_TEMPLATE")
		if err != nil || strings.TrimSpace(res.Stdout) != "tpl-value" {
			t.Fatalf("command in the claim's sandbox through the replica: %v %+v", err, res)
		}
		// Team B's key does not reach it.
		sdkB := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(keyB))
		if _, err := sdkB.Connect(ctx, id, time.Minute); err == nil {
			t.Errorf("team B connected to team A's claimed sandbox %s", id)
		}
	})

	// Measured, not asserted: a create through the replica (a Sandbox
	// object, placement, the agent's reconcile, the cache) against the
	// floor of a create on an agent's own API, in the same run.
	t.Run("create cost through the replica", func(t *testing.T) {
		floorSDK := agentbox.New(agentbox.WithAPIURL(agents["node-a"].URL), agentbox.WithSandboxURL(agents["node-a"].URL), agentbox.WithAPIKey(agents["node-a"].APIKey))
		timed := func(sdk *agentbox.Client) time.Duration {
			start := time.Now()
			sbx, err := sdk.Create(ctx, agentbox.CreateOptions{Timeout: 5 * time.Minute})
			took := time.Since(start)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if err := sbx.Kill(ctx); err != nil {
				t.Errorf("kill %s: %v", sbx.ID, err)
			}
			return took
		}
		var viaReplica, floor time.Duration
		for range 3 {
			viaReplica += timed(sdkA)
			floor += timed(floorSDK)
		}
		t.Logf("create through serve --kubernetes: %v; agent's own API floor: %v; ratio %.2f", viaReplica/3, floor/3, float64(viaReplica)/float64(floor))
	})

	t.Run("after one agent dies the other node's sandboxes answer", func(t *testing.T) {
		byNode := map[string]*agentbox.Sandbox{}
		for i := 0; i < 6 && len(byNode) < 2; i++ {
			sbx, err := sdkA.Create(ctx, agentbox.CreateOptions{Timeout: 10 * time.Minute, Metadata: map[string]string{"role": "spread"}})
			if err != nil {
				t.Fatalf("create through the replica: %v", err)
			}
			node, err := nodeOfSandboxID(ctx, c, sbx.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := byNode[node]; !ok {
				byNode[node] = sbx
			}
		}
		if len(byNode) < 2 {
			t.Fatalf("every sandbox went to one node: %v", byNode)
		}
		agents["node-b"].Kill9(t)
		sbx := byNode["node-a"]
		res, err := sbx.Commands.Run(ctx, "echo alive")
		if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
			t.Fatalf("node-a's sandbox %s through the replica after node-b died: %v %+v", sbx.ID, err, res)
		}
		if _, err := sdkA.Connect(ctx, sbx.ID, 5*time.Minute); err != nil {
			t.Errorf("connect to node-a's sandbox after node-b died: %v", err)
		}
	})
}

// teamCluster is a cluster with the keys namespace agentbox-system, the
// webhooks namespace agentbox-webhooks, team
// namespaces team-a and team-b, and a token secret file for the agents and
// the API replica.
func teamCluster(ctx context.Context, t *testing.T) (c client.Client, kubeconfig, secret string) {
	c, kubeconfig = cluster(ctx, t)
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	createTeamNamespace(ctx, t, c, "agentbox-webhooks", nil)
	createTeamNamespace(ctx, t, c, "team-a", map[string]any{"agentbox.dev/team": "team-a"})
	createTeamNamespace(ctx, t, c, "team-b", map[string]any{"agentbox.dev/team": "team-b"})
	secret = filepath.Join(t.TempDir(), "token-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("0123456789abcdef", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c, kubeconfig, secret
}

// drainTeamNamespaces deletes every pool, claim and Sandbox of the namespaces and
// waits for the Sandboxes to go (their agents kill them).
func drainTeamNamespaces(t *testing.T, c client.Client, namespaces ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range namespaces {
		for _, kind := range []schema.GroupVersionKind{
			{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Kind: "SandboxWarmPool"},
			claimGVK, sandboxGVK,
		} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(kind)
			if err := c.DeleteAllOf(ctx, u, client.InNamespace(ns)); err != nil {
				t.Errorf("delete %ss in %s: %v", kind.Kind, ns, err)
			}
		}
		waitFor(ctx, t, "every Sandbox of "+ns+" to go", func() (bool, string) {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
			if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
		})
	}
}
