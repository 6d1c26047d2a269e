package kubeapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/agentbox/agentbox/internal/gateway"
	"github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// defaultAssets is where scripts/k8s-test-bins.sh puts etcd and
// kube-apiserver.
const defaultAssets = "/var/cache/agentbox/k8s-bin/etcd-v3.6.16-kube-apiserver-v1.37.0"

// apiServer starts a kube-apiserver with the CRDs and a replica in front of
// it (no node agents: nothing ever becomes Ready).
func apiServer(t *testing.T) (client.Client, *httptest.Server) {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = defaultAssets
	}
	if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
		t.Skipf("envtest binaries missing (%v): run scripts/k8s-test-bins.sh", err)
	}
	_, file, _, _ := runtime.Caller(0)
	env := &envtest.Environment{BinaryAssetsDirectory: dir, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: []string{filepath.Join(filepath.Dir(file), "..", "..", "deploy", "k8s", "crds")}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := kube.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, team := range map[string]string{"agentbox-system": "", "team-a": "a", "team-b": "b"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if team != "" {
			ns.Labels = map[string]string{kube.LabelTeam: team}
		}
		if err := c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	for team, key := range map[string]string{"a": "e2b_keya", "b": "e2b_keyb"} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key-" + team, Namespace: "agentbox-system", Labels: map[string]string{kube.LabelTeam: team}},
			Type: SecretType, Data: map[string][]byte{KeyHashField: []byte(HashKey(key))}}
		if err := c.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	// A key Secret of the wrong type is no key.
	odd := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-a-key", Namespace: "agentbox-system", Labels: map[string]string{kube.LabelTeam: "a"}},
		Data: map[string][]byte{KeyHashField: []byte(HashKey("e2b_untyped"))}}
	if err := c.Create(ctx, odd); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	user, err := env.AddUser(envtest.User{Name: "api", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Kubeconfig: kc, KeysNamespace: "agentbox-system", LeaseNamespace: "agentbox-system",
		TokenSecret: []byte(strings.Repeat("s", 32)), CreateWait: 20 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return c, hs
}

func call(t *testing.T, hs *httptest.Server, key, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServerAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c, hs := apiServer(t)
	ctx := t.Context()

	t.Run("keys", func(t *testing.T) {
		for _, tc := range []struct {
			key  string
			want int
		}{{"", 401}, {"e2b_wrong", 401}, {"e2b_untyped", 401}, {"e2b_keya", 200}, {"e2b_keyb", 200}} {
			if got, body := call(t, hs, tc.key, "GET", "/v2/sandboxes", ""); got != tc.want {
				t.Errorf("key %q: %d %s, want %d", tc.key, got, body, tc.want)
			}
		}
	})

	// A Sandbox of team A, as an agent would have labelled it.
	id := "iteamasandbox0000001"
	sb := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "team-a", Labels: map[string]string{kube.LabelSandboxID: id},
		Annotations: map[string]string{AnnotationMetadata: `{"owner":"a"}`}}}
	sb.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "c", Image: "base"}}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.Status.SandboxID = id
	sb.Status.NodeName = "node-x"
	if err := c.Status().Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
	waitListed := func(key string, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, body := call(t, hs, key, "GET", "/v2/sandboxes", "")
			var got []map[string]any
			_ = json.Unmarshal([]byte(body), &got)
			if len(got) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("list: %s, want %d sandboxes", body, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitListed("e2b_keya", 1)

	t.Run("another team's sandbox answers like an unknown one", func(t *testing.T) {
		waitListed("e2b_keyb", 0)
		unknown := "iunknownsandbox00001"
		for _, r := range []struct{ method, path, body string }{
			{"GET", "", ""}, {"DELETE", "", ""}, {"POST", "/pause", ""}, {"POST", "/resume", ""},
			{"POST", "/timeout", `{"timeout":5}`}, {"POST", "/refreshes", ""}, {"POST", "/connect", `{"timeout":5}`},
		} {
			st1, b1 := call(t, hs, "e2b_keyb", r.method, "/sandboxes/"+id+r.path, r.body)
			st2, b2 := call(t, hs, "e2b_keyb", r.method, "/sandboxes/"+unknown+r.path, r.body)
			if st1 != 404 || st1 != st2 || strings.ReplaceAll(b1, id, "X") != strings.ReplaceAll(b2, unknown, "X") {
				t.Errorf("%s %s: theirs %d %s; unknown %d %s", r.method, r.path, st1, b1, st2, b2)
			}
		}
		if st, body := call(t, hs, "e2b_keya", "GET", "/sandboxes/"+id, ""); st != 200 || !strings.Contains(body, `"owner":"a"`) || !strings.Contains(body, "envdAccessToken") {
			t.Errorf("owner's get: %d %s", st, body)
		}
	})

	t.Run("data plane: unknown id is the gateway's 502; no agent address is a 502 naming the flag", func(t *testing.T) {
		req, _ := http.NewRequest("GET", hs.URL+"/health", nil)
		req.Header.Set("E2b-Sandbox-Id", "inosuchsandbox")
		req.Header.Set("E2b-Sandbox-Port", "49983")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 502 || !strings.Contains(string(b), "The sandbox was not found") {
			t.Errorf("unknown id: %d %s", resp.StatusCode, b)
		}
		req.Header.Set("E2b-Sandbox-Id", id)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 502 || !strings.Contains(string(b), "node-x") {
			t.Errorf("no agent for node-x: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("data plane: traffic goes to the agent on the node's Lease, headers and Host kept", func(t *testing.T) {
		type seen struct{ host, id, xff, path string }
		got := make(chan seen, 4)
		agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- seen{r.Host, r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("X-Forwarded-For"), r.URL.RequestURI()}
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "from the agent")
		}))
		defer agent.Close()
		st, _ := json.Marshal(kube.NodeStatus{Node: "node-x", Address: strings.TrimPrefix(agent.URL, "http://")})
		lease := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: kube.LeasePrefix + "node-x", Namespace: "agentbox-system",
			Annotations: map[string]string{kube.AnnotationNodeStatus: string(st)}}}
		if err := c.Create(ctx, lease); err != nil {
			t.Fatal(err)
		}
		do := func(req *http.Request) (int, string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
					return resp.StatusCode, string(b)
				}
				time.Sleep(100 * time.Millisecond) // the Lease reaches the cache
			}
		}
		req, _ := http.NewRequest("GET", hs.URL+"/files?path=/x", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		if code, body := do(req); code != 200 || body != "from the agent" {
			t.Fatalf("header-routed: %d %s", code, body)
		}
		if s := <-got; s.id != id || s.path != "/files?path=/x" || s.xff == "" || s.host != strings.TrimPrefix(hs.URL, "http://") {
			t.Errorf("the agent saw %+v", s)
		}
		req, _ = http.NewRequest("GET", hs.URL+"/health", nil)
		req.Host = "49983-" + id + ".sandbox.example"
		if code, body := do(req); code != 200 {
			t.Fatalf("host-routed: %d %s", code, body)
		}
		if s := <-got; s.host != "49983-"+id+".sandbox.example" {
			t.Errorf("the agent saw Host %q", s.host)
		}
		sig := gateway.Signature("/x", "read", "user", sandbox.AccessToken([]byte(strings.Repeat("s", 32)), id), "")
		req, _ = http.NewRequest("GET", hs.URL+"/files?path=/x&username=user&signature="+sig, nil)
		if code, body := do(req); code != 200 {
			t.Fatalf("signed URL: %d %s", code, body)
		}
		<-got
		req, _ = http.NewRequest("GET", hs.URL+"/files?path=/x&username=user&signature=v1_forged", nil)
		if code, body := do(req); code != 401 {
			t.Errorf("forged signature: %d %s", code, body)
		}
	})

	t.Run("a copied id reaches nothing", func(t *testing.T) {
		dup := sb.DeepCopy()
		dup.ObjectMeta = metav1.ObjectMeta{Name: "copy", Namespace: "team-b", Labels: map[string]string{kube.LabelSandboxID: id}}
		if err := c.Create(ctx, dup); err != nil {
			t.Fatal(err)
		}
		dup.Status.SandboxID = id
		if err := c.Status().Update(ctx, dup); err != nil {
			t.Fatal(err)
		}
		waitListed("e2b_keya", 0)
		for _, key := range []string{"e2b_keya", "e2b_keyb"} {
			if st, body := call(t, hs, key, "GET", "/sandboxes/"+id, ""); st != 404 {
				t.Errorf("key %s: %d %s, want 404 while two Sandboxes carry the id", key, st, body)
			}
		}
		if err := c.Delete(ctx, dup); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a create no agent runs fails naming why and leaves nothing", func(t *testing.T) {
		st, body := call(t, hs, "e2b_keya", "POST", "/v2/sandboxes", `{"templateID":"base","timeout":60}`)
		if st < 400 {
			t.Fatalf("create without agents: %d %s", st, body)
		}
		// The replica waits (no agent ever reports) and then cleans up.
		var list agentsv1.SandboxList
		if err := c.List(ctx, &list, client.InNamespace("team-a"), client.HasLabels{LabelOrigin}); err != nil {
			t.Fatal(err)
		}
		for _, o := range list.Items {
			if o.DeletionTimestamp.IsZero() {
				t.Errorf("failed create left Sandbox %s", o.Name)
			}
		}
	})

	t.Run("not served endpoints say so", func(t *testing.T) {
		st, body := call(t, hs, "e2b_keya", "GET", "/templates", "")
		if st != 404 || !strings.Contains(body, "serve --kubernetes") {
			t.Errorf("%d %s", st, body)
		}
	})
}
