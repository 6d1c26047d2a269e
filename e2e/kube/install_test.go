package kube

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestKubeInstallManifests applies what deploy/k8s installs (the
// kustomization's resources and the node-agent DaemonSet) to a real API
// server, which validates every object, then runs a node agent and a
// `serve --kubernetes` replica with the tokens of the manifests' own
// ServiceAccounts: with RBAC enforced, the roles in deploy/k8s must be
// enough for a claim to become Ready and for a create, get and kill through
// the replica, and neither logs a forbidden request.
func TestKubeInstallManifests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, adminKC := cluster(ctx, t)
	deploy := filepath.Join(harness.RepoRoot(t), "deploy", "k8s")

	t.Run("every manifest is accepted", func(t *testing.T) {
		var k struct {
			Resources []string `json:"resources"`
		}
		b, err := os.ReadFile(filepath.Join(deploy, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatalf("kustomization.yaml: %v", err)
		}
		// The CRDs are installed by the cluster already; the DaemonSet is the
		// alternative to the single-server Deployment and is applied on its own.
		var files []string
		for _, r := range k.Resources {
			if !strings.HasPrefix(r, "crds/") {
				files = append(files, r)
			}
		}
		files = append(files, "agentbox-daemonset.yaml")
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(deploy, f))
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range decode(t, string(b)) {
				if err := c.Create(ctx, u); err != nil {
					t.Fatalf("%s: create %s %s/%s: %v", f, u.GetKind(), u.GetNamespace(), u.GetName(), err)
				}
			}
		}
	})

	createTeamNamespace(ctx, t, c, "team-i", map[string]any{"agentbox.dev/team": "team-i"})
	agentKC := serviceAccountKubeconfig(ctx, t, c, adminKC, "agentbox-system", "agentbox")
	apiKC := serviceAccountKubeconfig(ctx, t, c, adminKC, "agentbox-system", "agentbox-api")
	secret := filepath.Join(t.TempDir(), "token-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("fedcba9876543210", 4)), 0o600); err != nil {
		t.Fatal(err)
	}

	// The DaemonSet's flags, with the agent's ServiceAccount token.
	agent := harness.Start(t, harness.Args("--kube-controller", "--kubeconfig", agentKC,
		"--kube-node", "node-i", "--kube-leader-elect", "--kube-leader-elect-namespace", "agentbox-system",
		"--kube-lease-namespace", "agentbox-system", "--kube-team", ns+"=default", "--token-secret-file", secret))
	t.Cleanup(func() {
		drain(t, c)
		drainTeamNamespaces(t, c, "team-i")
	})

	t.Run("the agent's role runs a claim", func(t *testing.T) {
		for _, u := range decode(t, manifests) {
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		var id string
		waitFor(ctx, t, "my-claim Ready", func() (bool, string) {
			u, err := get(ctx, c, claimGVK, "my-claim")
			if err != nil {
				return false, err.Error()
			}
			id, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "sandboxID")
			rc := condition(u, "Ready")
			return rc != nil && rc.Status == metav1.ConditionTrue && id != "", fmtCond(rc)
		})
		sdk := agentbox.New(agentbox.WithAPIURL(agent.URL), agentbox.WithSandboxURL(agent.URL), agentbox.WithAPIKey(agent.APIKey))
		sbx, err := sdk.Connect(ctx, id, 5*time.Minute)
		if err != nil {
			t.Fatalf("connect to the claim's sandbox %s: %v", id, err)
		}
		res, err := sbx.Commands.Run(ctx, "echo $FROM_TEMPLATE")
		if err != nil || strings.TrimSpace(res.Stdout) != "tpl-value" {
			t.Fatalf("command in the claim's sandbox: %v %+v", err, res)
		}
	})

	t.Run("the API tier's role serves a create", func(t *testing.T) {
		rep := startReplica(t, agent.Bin, apiKC, secret)
		key := mintKubeKey(t, agent.Bin, adminKC, "team-i")
		sdk := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(key))
		sbx, err := sdk.Create(ctx, agentbox.CreateOptions{Timeout: 5 * time.Minute})
		if err != nil {
			b, _ := os.ReadFile(rep.log)
			t.Fatalf("create through the replica: %v\n%s", err, replicaLogTail(string(b), 40))
		}
		res, err := sbx.Commands.Run(ctx, "echo through-the-replica")
		if err != nil || strings.TrimSpace(res.Stdout) != "through-the-replica" {
			t.Fatalf("command through the replica: %v %+v", err, res)
		}
		if err := sbx.Kill(ctx); err != nil {
			t.Fatalf("kill through the replica: %v", err)
		}
		b, _ := os.ReadFile(rep.log)
		if bytes.Contains(bytes.ToLower(b), []byte("forbidden")) {
			t.Errorf("the replica was refused something by RBAC:\n%s", grepLines(string(b), "forbidden"))
		}
	})

	t.Run("the agent was refused nothing", func(t *testing.T) {
		b, err := os.ReadFile(agent.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(bytes.ToLower(b), []byte("forbidden")) {
			t.Errorf("the agent was refused something by RBAC:\n%s", grepLines(string(b), "forbidden"))
		}
	})

	t.Run("the agent's role cannot read API keys", func(t *testing.T) {
		// A node agent runs tenant code on its node: it must not be able to
		// read the API tier's key Secrets.
		cfg, err := clientcmd.BuildConfigFromFlags("", agentKC)
		if err != nil {
			t.Fatal(err)
		}
		ac, err := client.New(cfg, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = ac.List(ctx, &corev1.SecretList{}, client.InNamespace("agentbox-system"))
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "forbidden") {
			t.Errorf("agent's ServiceAccount listing Secrets in agentbox-system: err = %v, want forbidden", err)
		}
		// It reads the webhooks, which have a namespace of their own.
		if err := ac.List(ctx, &corev1.SecretList{}, client.InNamespace("agentbox-webhooks")); err != nil {
			t.Errorf("agent's ServiceAccount listing the webhook Secrets in agentbox-webhooks: %v", err)
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-webhooks", Name: "agentbox-webhook-forged"}}
		if err := ac.Create(ctx, sec); err == nil || !strings.Contains(strings.ToLower(err.Error()), "forbidden") {
			t.Errorf("agent's ServiceAccount creating a webhook Secret: err = %v, want forbidden", err)
		}
	})

	t.Run("the API tier's role writes webhooks only", func(t *testing.T) {
		// The replicas write the webhooks teams register, and no Secret
		// beside the API keys (a replica could mint itself a key).
		cfg, err := clientcmd.BuildConfigFromFlags("", apiKC)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := client.New(cfg, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-system", Name: "forged-api-key"}}
		if err := pc.Create(ctx, key); err == nil || !strings.Contains(strings.ToLower(err.Error()), "forbidden") {
			t.Errorf("API tier's ServiceAccount creating a Secret in agentbox-system: err = %v, want forbidden", err)
		}
		hook := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-webhooks", Name: "agentbox-webhook-rbac-probe"}}
		if err := pc.Create(ctx, hook); err != nil {
			t.Errorf("API tier's ServiceAccount creating a Secret in agentbox-webhooks: %v", err)
		} else if err := pc.Delete(ctx, hook); err != nil {
			t.Errorf("API tier's ServiceAccount deleting a Secret in agentbox-webhooks: %v", err)
		}
	})
}

// serviceAccountKubeconfig writes a kubeconfig holding a token of the
// ServiceAccount, minted through the TokenRequest API as the kubelet does
// for a pod, for the admin kubeconfig's server.
func serviceAccountKubeconfig(ctx context.Context, t *testing.T, c client.Client, adminKC, namespace, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, sa); err != nil {
		t.Fatalf("ServiceAccount %s/%s from deploy/k8s: %v", namespace, name, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("token for %s/%s: %v", namespace, name, err)
	}
	admin, err := clientcmd.LoadFromFile(adminKC)
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = cluster
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: name}
	kc.CurrentContext = name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(l), sub) {
			out = append(out, l)
		}
	}
	if len(out) > 20 {
		out = out[:20]
	}
	return strings.Join(out, "\n")
}
