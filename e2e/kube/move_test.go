package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

const (
	s3Bucket = "agentbox-images"
	nsB      = "agents-b"
)

// s3Server serves an in-memory S3 (gofakes3) on a real listener: the
// agents talk the S3 protocol to it through minio-go, as to any bucket.
func s3Server(t *testing.T) (url string, raw *minio.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gofakes3.New(s3mem.New(), gofakes3.WithLogger(gofakes3.DiscardLog())).Server()}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	raw, err = minio.New(ln.Addr().String(), &minio.Options{Creds: credentials.NewStaticV4("test-access", "test-secret", ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.MakeBucket(context.Background(), s3Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	return "http://" + ln.Addr().String() + "/" + s3Bucket, raw
}

func bucketKeys(ctx context.Context, t *testing.T, raw *minio.Client, prefix string) []string {
	t.Helper()
	var out []string
	for o := range raw.ListObjects(ctx, s3Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

func readObject(ctx context.Context, t *testing.T, raw *minio.Client, key string) []byte {
	t.Helper()
	o, err := raw.GetObject(ctx, s3Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(o)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func writeObject(ctx context.Context, t *testing.T, raw *minio.Client, key string, b []byte) {
	t.Helper()
	if _, err := raw.PutObject(ctx, s3Bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{DisableContentSha256: true}); err != nil {
		t.Fatal(err)
	}
}

func getIn(ctx context.Context, c client.Client, namespace, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(sandboxGVK)
	return u, c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u)
}

func status(u *unstructured.Unstructured, field string) string {
	s, _, _ := unstructured.NestedString(u.Object, "status", field)
	return s
}

// storedImage reads the Sandbox's agentbox.dev/image annotation.
func storedImageOf(u *unstructured.Unstructured) (img struct {
	Node       string `json:"node"`
	SandboxID  string `json:"sandboxID"`
	Generation int64  `json:"generation"`
	Prefix     string `json:"prefix"`
}, ok bool) {
	raw, ok := u.GetAnnotations()["agentbox.dev/image"]
	return img, ok && json.Unmarshal([]byte(raw), &img) == nil
}

// events lists the reasons and notes of the events of the Sandbox name
// in the test namespace.
func events(ctx context.Context, t *testing.T, c client.Client, name string) []string {
	t.Helper()
	return eventsIn(ctx, t, c, ns, name)
}

// leftovers lists what sandbox id left on the host of s: mounts, files
// under its data dir, network namespaces and cgroups naming it.
func leftovers(s *harness.Server, id string) []string {
	var out []string
	if m, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.Lines(string(m)) {
			if strings.Contains(line, id) {
				out = append(out, "mount: "+strings.TrimSpace(line))
			}
		}
	}
	_ = filepath.WalkDir(s.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), id) {
			out = append(out, "file: "+p)
		}
		return nil
	})
	for _, dir := range []string{"/run/netns", "/sys/fs/cgroup"} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && strings.Count(strings.TrimPrefix(p, dir), "/") > 4 {
				return fs.SkipDir
			}
			if strings.Contains(d.Name(), id) {
				out = append(out, "host: "+p)
				if d.IsDir() {
					return fs.SkipDir
				}
			}
			return nil
		})
	}
	return out
}

// sandboxesOf lists the ids of the sandboxes an agent's API shows.
func sandboxesOf(ctx context.Context, t *testing.T, s *harness.Server) []string {
	t.Helper()
	st, body, err := s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes?state=running,paused", nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("list sandboxes: %v %d %s", err, st, body)
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("list sandboxes: %v: %s", err, body)
	}
	var out []string
	for _, sb := range list {
		out = append(out, sb.SandboxID)
	}
	return out
}

// TestKubeSuspendedMoves suspends a Sandbox on node-a, whose agent stores
// the sealed image in an S3 bucket; node-a dies, the Sandbox moves to
// node-b, and set Running it comes back there with its process and files,
// under the same sandbox id: a client of serve --kubernetes that held the
// id still reaches it. A flipped byte in the bucket and another tenant's
// copy of the objects are refused and restore nothing.
func TestKubeSuspendedMoves(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)
	nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": nsB}}}
	if err := c.Create(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	// ns is team default's for serve --kubernetes too (the agents bind it
	// with --kube-team as well).
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	nsU := &unstructured.Unstructured{}
	nsU.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"})
	nsU.SetName(ns)
	if err := c.Patch(ctx, nsU, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"agentbox.dev/team":"default"}}}`))); err != nil {
		t.Fatal(err)
	}
	url, raw := s3Server(t)
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile, credFile, secret := filepath.Join(dir, "image.key"), filepath.Join(dir, "s3.env"), filepath.Join(dir, "token-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("0123456789abcdef", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(credFile, []byte("AWS_ACCESS_KEY_ID=test-access\nAWS_SECRET_ACCESS_KEY=test-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	agent := func(node string, extra ...string) *harness.Server {
		return harness.Start(t, harness.Name(t.Name()+"-"+node), harness.Args(append([]string{"--kube-controller", "--kubeconfig", kcPath,
			"--kube-node", node, "--kube-team", ns + "=default", "--kube-team", nsB + "=default",
			"--kube-leader-elect", "--kube-leader-elect-namespace", "default",
			"--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret,
			"--kube-object-store", url, "--kube-object-store-key-file", keyFile, "--kube-object-store-credentials-file", credFile}, extra...)...))
	}
	// node-a has more room: the Sandbox starts there.
	a := agent("node-a", "--kube-node-cpu", "16", "--kube-node-memory-mb", "32768")
	b := agent("node-b", "--kube-node-cpu", "4", "--kube-node-memory-mb", "4096")
	t.Cleanup(func() { drain(t, c) })
	sdkOf := func(s *harness.Server) *agentbox.Client {
		return agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	}
	rep := startReplica(t, a.Bin, kcPath, secret)
	viaReplica := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(mintKubeKey(t, a.Bin, kcPath, "default")))
	waitCond := func(namespace, name, typ, what string, ok func(c *metav1.Condition, u *unstructured.Unstructured) bool) *unstructured.Unstructured {
		t.Helper()
		var last *unstructured.Unstructured
		waitFor(ctx, t, name+" "+what, func() (bool, string) {
			u, err := getIn(ctx, c, namespace, name)
			if err != nil {
				return false, err.Error()
			}
			last = u
			cond := condition(u, typ)
			return cond != nil && ok(cond, u), fmtCond(cond) + " on " + status(u, "nodeName")
		})
		return last
	}

	u := decode(t, direct)[0]
	u.SetName("mover")
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	idA := waitReady(ctx, t, c, "mover")
	if u, _ := getIn(ctx, c, ns, "mover"); status(u, "nodeName") != "node-a" {
		t.Fatalf("mover is on %q, want node-a", status(u, "nodeName"))
	}
	sbx, err := sdkOf(a).Connect(ctx, idA, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A counter that lives only in the memory of a shell, and a file.
	res, err := sbx.Commands.Run(ctx, `sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &
echo $! > /tmp/counter.pid; echo 'written on node-a' > /tmp/moved.txt; sleep 0.5
pid=$(cat /tmp/counter.pid); echo "$pid $(cut -d' ' -f2 /proc/$pid/stat)"`)
	if err != nil {
		t.Fatal(err)
	}
	before := strings.Fields(res.Stdout)
	if len(before) != 2 {
		t.Fatalf("counter pid and state: %q", res.Stdout)
	}
	res, err = sbx.Commands.Run(ctx, `cat /tmp/count`)
	if err != nil {
		t.Fatal(err)
	}
	countBefore, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	// A client of the API tier holds the id (and its envd token).
	held, err := viaReplica.Connect(ctx, idA, 10*time.Minute)
	if err != nil {
		t.Fatalf("connect through serve --kubernetes: %v", err)
	}
	if res, err := held.Commands.Run(ctx, `cat /tmp/moved.txt`); err != nil || strings.TrimSpace(res.Stdout) != "written on node-a" {
		t.Fatalf("command through serve --kubernetes on node-a: %v %+v", err, res)
	}

	mode(ctx, t, c, "mover", "Suspended")
	u = waitCond(ns, "mover", "ImageStored", "ImageStored=True", func(c *metav1.Condition, _ *unstructured.Unstructured) bool {
		return c.Status == metav1.ConditionTrue
	})
	img, ok := storedImageOf(u)
	if !ok || img.Node != "node-a" || img.SandboxID != idA || !strings.HasPrefix(img.Prefix, ns+"/"+idA+"/") {
		t.Fatalf("agentbox.dev/image = %+v (ok %v)", img, ok)
	}
	keys := bucketKeys(ctx, t, raw, img.Prefix)
	if len(keys) != 2 {
		t.Fatalf("bucket under %s: %v, want image.tar and manifest", img.Prefix, keys)
	}
	// The bucket holds no plaintext: not the file's text, not the record.
	for _, k := range keys {
		if obj := readObject(ctx, t, raw, k); bytes.Contains(obj, []byte("written on node-a")) || bytes.Contains(obj, []byte(idA)) {
			t.Errorf("object %s holds plaintext", k)
		}
	}

	a.Kill9(t)
	waitCond(ns, "mover", "Ready", "moved to node-b", func(_ *metav1.Condition, u *unstructured.Unstructured) bool {
		return status(u, "nodeName") == "node-b"
	})
	waitFor(ctx, t, "a Moved event naming both nodes", func() (bool, string) {
		evs := events(ctx, t, c, "mover")
		for _, e := range evs {
			if strings.HasPrefix(e, "Moved: ") && strings.Contains(e, "from node node-a to node node-b") {
				return true, ""
			}
		}
		return false, strings.Join(evs, " | ")
	})
	waitCond(ns, "mover", "Suspended", "Suspended on node-b", func(c *metav1.Condition, _ *unstructured.Unstructured) bool {
		return c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "node-b")
	})

	restoreStart := time.Now()
	mode(ctx, t, c, "mover", "Running")
	idB := waitReady(ctx, t, c, "mover")
	restoreTook := time.Since(restoreStart)
	if idB != idA {
		t.Fatalf("restored as sandbox %s, want its own id %s", idB, idA)
	}
	if u, _ := getIn(ctx, c, ns, "mover"); u.GetLabels()["agentbox.dev/sandbox-id"] != idA {
		t.Errorf("label agentbox.dev/sandbox-id = %q after the move, want %s", u.GetLabels()["agentbox.dev/sandbox-id"], idA)
	}
	sbx, err = sdkOf(b).Connect(ctx, idB, 10*time.Minute)
	if err != nil {
		t.Fatalf("connect on node-b: %v", err)
	}
	res, err = sbx.Commands.Run(ctx, `pid=$(cat /tmp/counter.pid); echo "$pid $(cut -d' ' -f2 /proc/$pid/stat)"; cat /tmp/moved.txt; cat /tmp/count; sleep 0.5; cat /tmp/count`)
	if err != nil {
		t.Fatalf("command on node-b: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 4 || lines[0] != strings.Join(before, " ") || lines[1] != "written on node-a" {
		t.Fatalf("on node-b: %q; want the counter %v alive (same pid, a live state) and the file", res.Stdout, before)
	}
	c1, _ := strconv.Atoi(lines[2])
	c2, _ := strconv.Atoi(lines[3])
	if c1 < countBefore || c2 <= c1 {
		t.Errorf("counter %d at the suspension, %d then %d on node-b: want it to go on from its memory", countBefore, c1, c2)
	}
	if left := bucketKeys(ctx, t, raw, ns+"/"+idA+"/"); len(left) != 0 {
		t.Errorf("stored image kept after the restore: %v", left)
	}
	if ids := sandboxesOf(ctx, t, b); len(ids) != 1 || ids[0] != idA {
		t.Errorf("node-b runs %v, want %s", ids, idA)
	}
	// The client's handle from before the move: same id, same envd token,
	// now routed by the replica to node-b.
	res, err = held.Commands.Run(ctx, `cat /tmp/moved.txt`)
	if err != nil || strings.TrimSpace(res.Stdout) != "written on node-a" {
		t.Fatalf("the held handle through serve --kubernetes after the move: %v %+v", err, res)
	}
	if _, err := viaReplica.GetInfo(ctx, idA); err != nil {
		t.Errorf("getInfo %s through serve --kubernetes after the move: %v", idA, err)
	}

	t.Run("the returning agent removes its copy", func(t *testing.T) {
		a.Launch(t)
		waitFor(ctx, t, "node-a's copy to go", func() (bool, string) {
			left := append(sandboxesOf(ctx, t, a), leftovers(a, idA)...)
			return len(left) == 0, strings.Join(left, ", ")
		})
		// Removing node-a's copy of the id left node-b's sandbox of the
		// same id (on this one host) alone.
		if res, err := held.Commands.Run(ctx, `cat /tmp/moved.txt`); err != nil || strings.TrimSpace(res.Stdout) != "written on node-a" {
			t.Fatalf("node-b's sandbox %s after node-a removed its copy: %v %+v", idA, err, res)
		}
	})

	t.Run("another tenant's Sandbox cannot restore the image", func(t *testing.T) {
		mode(ctx, t, c, "mover", "Suspended")
		u := waitCond(ns, "mover", "ImageStored", "stored on node-b", func(c *metav1.Condition, u *unstructured.Unstructured) bool {
			img, _ := storedImageOf(u)
			return c.Status == metav1.ConditionTrue && img.Node == "node-b"
		})
		first, _ := storedImageOf(u)
		// A resume in place (the floor of a restore through the bucket)
		// deletes the stored image: no other agent may restore it after.
		localStart := time.Now()
		mode(ctx, t, c, "mover", "Running")
		if got := waitReady(ctx, t, c, "mover"); got != idB {
			t.Errorf("resumed in place as %s, want %s", got, idB)
		}
		localTook := time.Since(localStart)
		t.Logf("Running to Ready: restored through the bucket on another node %v; resumed in place (floor) %v; ratio %.2f",
			restoreTook, localTook, restoreTook.Seconds()/localTook.Seconds())
		waitCond(ns, "mover", "ImageStored", "ImageStored=False after the resume", func(c *metav1.Condition, u *unstructured.Unstructured) bool {
			_, has := storedImageOf(u)
			return c.Status == metav1.ConditionFalse && c.Reason == "Resumed" && !has
		})
		if left := bucketKeys(ctx, t, raw, first.Prefix); len(left) != 0 {
			t.Errorf("stored image kept after a resume in place: %v", left)
		}
		mode(ctx, t, c, "mover", "Suspended")
		u = waitCond(ns, "mover", "ImageStored", "stored again on node-b", func(c *metav1.Condition, u *unstructured.Unstructured) bool {
			img, _ := storedImageOf(u)
			return c.Status == metav1.ConditionTrue && img.Node == "node-b" && img.Prefix != first.Prefix
		})
		img, _ := storedImageOf(u)
		// A bucket writer copies the objects under the other tenant's
		// prefix, and that tenant points its Sandbox at them.
		theirs := fmt.Sprintf("%s/%s/%d/", nsB, img.SandboxID, img.Generation)
		for _, k := range bucketKeys(ctx, t, raw, img.Prefix) {
			writeObject(ctx, t, raw, theirs+strings.TrimPrefix(k, img.Prefix), readObject(ctx, t, raw, k))
		}
		ann, _ := json.Marshal(map[string]any{"node": "node-z", "sandboxID": img.SandboxID, "generation": img.Generation, "prefix": theirs})
		thief := decode(t, direct)[0]
		thief.SetName("thief")
		thief.SetNamespace(nsB)
		thief.SetAnnotations(map[string]string{"agentbox.dev/image": string(ann)})
		if err := c.Create(ctx, thief); err != nil {
			t.Fatal(err)
		}
		waitCond(nsB, "thief", "Ready", "refused", func(c *metav1.Condition, _ *unstructured.Unstructured) bool {
			return c.Reason == "ImageIntegrityFailed" && strings.Contains(c.Message, "does not authenticate")
		})
		got, _ := getIn(ctx, c, nsB, "thief")
		if id := status(got, "sandboxID"); id != "" {
			t.Errorf("thief got sandbox %s", id)
		}
		for _, s := range []*harness.Server{a, b} {
			if ids := sandboxesOf(ctx, t, s); len(ids) > 1 {
				t.Errorf("%s runs %v; want at most the paused mover", s.Instance, ids)
			}
		}
		if err := c.Delete(ctx, thief); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "thief deleted", func() (bool, string) {
			_, err := getIn(ctx, c, nsB, "thief")
			return err != nil, fmt.Sprint(err)
		})
	})

	t.Run("a tampered image restores nothing", func(t *testing.T) {
		u, _ := getIn(ctx, c, ns, "mover")
		img, ok := storedImageOf(u)
		if !ok || img.Node != "node-b" {
			t.Fatalf("image %+v", img)
		}
		k := img.Prefix + "image.tar"
		obj := readObject(ctx, t, raw, k)
		obj[len(obj)/2] ^= 0x01
		writeObject(ctx, t, raw, k, obj)
		b.Kill9(t)
		waitCond(ns, "mover", "Ready", "moved to node-a", func(_ *metav1.Condition, u *unstructured.Unstructured) bool {
			return status(u, "nodeName") == "node-a"
		})
		mode(ctx, t, c, "mover", "Running")
		waitCond(ns, "mover", "Ready", "refused", func(c *metav1.Condition, _ *unstructured.Unstructured) bool {
			return c.Reason == "ImageIntegrityFailed" && strings.Contains(c.Message, "integrity")
		})
		if ids := sandboxesOf(ctx, t, a); len(ids) != 0 {
			t.Errorf("node-a runs %v after a refused restore", ids)
		}
		// node-b returns and drops its copy; deleting the Sandbox deletes
		// its objects.
		b.Launch(t)
		waitFor(ctx, t, "node-b's copy to go", func() (bool, string) {
			left := sandboxesOf(ctx, t, b)
			return len(left) == 0, strings.Join(left, ", ")
		})
		if err := c.Delete(ctx, u); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the bucket to empty", func() (bool, string) {
			left := bucketKeys(ctx, t, raw, ns+"/")
			return len(left) == 0, strings.Join(left, ", ")
		})
	})
}
