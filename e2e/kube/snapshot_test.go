package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

var snapshotGVK = schema.GroupVersionKind{Group: "agentbox.dev", Version: "v1alpha1", Kind: "SandboxSnapshot"}

// callReplica sends one E2B API request with key to serve --kubernetes.
func callReplica(ctx context.Context, t *testing.T, base, key, method, path string, body any) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var list []snapshotInfo
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("snapshot list: %v: %s", err, body)
	}
	var out []string
	for _, s := range list {
		out = append(out, s.SnapshotID)
	}
	return out
}

// snapshotObject finds the SandboxSnapshot an E2B snapshot id names.
func snapshotObject(ctx context.Context, t *testing.T, c client.Client, ns, snapshotID string) *unstructured.Unstructured {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(snapshotGVK.GroupVersion().WithKind("SandboxSnapshotList"))
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	key, _, _ := strings.Cut(snapshotID, ":")
	for i := range list.Items {
		u := &list.Items[i]
		name, _, _ := unstructured.NestedString(u.Object, "spec", "name")
		if u.GetName() == key || name == key {
			return u
		}
	}
	t.Fatalf("no SandboxSnapshot in %s for %s", ns, snapshotID)
	return nil
}

// TestKubeSnapshots takes an E2B snapshot through serve --kubernetes of a
// sandbox on node-a, whose agent stores it sealed in an S3 bucket, and
// starts a sandbox from it on node-b (process and file there). Another
// team cannot see, use or delete it; a tampered object restores nothing;
// deleting it empties its prefix and removes node-a's copy.
func TestKubeSnapshots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	createTeamNamespace(ctx, t, c, "team-a", map[string]any{"agentbox.dev/team": "team-a"})
	createTeamNamespace(ctx, t, c, "team-b", map[string]any{"agentbox.dev/team": "team-b"})
	url, raw := s3Server(t)
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile, credFile, secret := filepath.Join(dir, "image.key"), filepath.Join(dir, "s3.env"), filepath.Join(dir, "token-secret")
	for _, f := range []struct{ path, body string }{
		{keyFile, hex.EncodeToString(key)},
		{credFile, "AWS_ACCESS_KEY_ID=test-access\nAWS_SECRET_ACCESS_KEY=test-secret\n"},
		{secret, strings.Repeat("0123456789abcdef", 4)},
	} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	agent := func(node string, mem string) *harness.Server {
		return harness.Start(t, harness.Name(t.Name()+"-"+node), harness.Args("--kube-controller", "--kubeconfig", kcPath,
			"--kube-node", node, "--kube-leader-elect", "--kube-leader-elect-namespace", "default",
			"--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret,
			"--kube-node-cpu", "8", "--kube-node-memory-mb", mem,
			"--kube-object-store", url, "--kube-object-store-key-file", keyFile, "--kube-object-store-credentials-file", credFile))
	}
	// node-a alone first, so the source sandbox runs there; node-b, with
	// more room, joins later and placement prefers it.
	a := agent("node-a", "4096")
	// Cleanups run last first: each agent's teardown (which kills only its
	// own team's sandboxes) comes after the drain registered after it.
	drain := func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		for _, ns := range []string{"team-a", "team-b"} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(snapshotGVK)
			if err := c.DeleteAllOf(dctx, u, client.InNamespace(ns)); err != nil {
				t.Errorf("delete SandboxSnapshots in %s: %v", ns, err)
			}
		}
		drainTeamNamespaces(t, c, "team-a", "team-b")
		waitFor(dctx, t, "every SandboxSnapshot to go (their agents delete their copies)", func() (bool, string) {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(snapshotGVK.GroupVersion().WithKind("SandboxSnapshotList"))
			if err := c.List(dctx, list); err != nil {
				return false, err.Error()
			}
			return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
		})
	}
	t.Cleanup(drain)
	rep := startReplica(t, a.Bin, kcPath, secret)
	keyA, keyB := mintKubeKey(t, a.Bin, kcPath, "team-a"), mintKubeKey(t, a.Bin, kcPath, "team-b")
	sdkA := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(keyA))

	src, err := sdkA.Create(ctx, agentbox.CreateOptions{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("create through the replica: %v", err)
	}
	if n, err := nodeOfSandboxID(ctx, c, src.ID); err != nil || n != "node-a" {
		t.Fatalf("source sandbox on %q (%v), want node-a", n, err)
	}
	res, err := src.Commands.Run(ctx, `sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &
echo $! > /tmp/counter.pid; echo 'written before the snapshot' > /tmp/snap.txt; sleep 0.5
pid=$(cat /tmp/counter.pid); echo "$pid $(cut -d' ' -f2 /proc/$pid/stat)"`)
	if err != nil {
		t.Fatal(err)
	}
	counter := strings.TrimSpace(res.Stdout)

	st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]any{})
	if st != http.StatusCreated {
		t.Fatalf("create snapshot: %d %s", st, body)
	}
	var info snapshotInfo
	if err := json.Unmarshal(body, &info); err != nil || info.SnapshotID == "" || !slices.Contains(info.Names, info.SnapshotID) {
		t.Fatalf("create snapshot answer: %v %s", err, body)
	}
	snapID := info.SnapshotID
	name, _, _ := strings.Cut(snapID, ":")
	prefix := "team-a/" + name + "/snapshot/"
	waitFor(ctx, t, "the snapshot to be stored", func() (bool, string) {
		u := snapshotObject(ctx, t, c, "team-a", snapID)
		loc, _, _ := unstructured.NestedString(u.Object, "status", "location")
		return loc == prefix, fmtCond(condition(u, "Ready")) + " location " + loc
	})
	u := snapshotObject(ctx, t, c, "team-a", snapID)
	localID, _, _ := unstructured.NestedString(u.Object, "status", "snapshotID")
	if n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName"); n != "node-a" || localID == "" {
		t.Fatalf("SandboxSnapshot status: node %q snapshot %q", n, localID)
	}
	keys := bucketKeys(ctx, t, raw, prefix)
	if len(keys) != 2 {
		t.Fatalf("bucket under %s: %v, want image.tar and manifest", prefix, keys)
	}
	for _, k := range keys {
		if obj := readObject(ctx, t, raw, k); bytes.Contains(obj, []byte("written before the snapshot")) || bytes.Contains(obj, []byte(src.ID)) {
			t.Errorf("object %s holds plaintext", k)
		}
	}

	t.Run("another team cannot see, use or delete it", func(t *testing.T) {
		st, body, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodGet, "/snapshots", nil)
		if st != http.StatusOK || len(snapshotIDs(t, body)) != 0 {
			t.Errorf("team B lists %d %s", st, body)
		}
		st, body, _ = callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]any{})
		if st != http.StatusNotFound {
			t.Errorf("team B snapshots team A's sandbox: %d %s", st, body)
		}
		unknown := "snap" + strings.Repeat("z", 20) + ":default"
		for _, id := range []string{snapID, unknown} {
			if st, body, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodDelete, "/templates/"+id, nil); st != http.StatusNotFound {
				t.Errorf("team B deletes %s: %d %s", id, st, body)
			}
		}
		// A create from it fails exactly as from an unknown snapshot id.
		stTheirs, bodyTheirs, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes", map[string]any{"templateID": snapID, "timeout": 60})
		stUnknown, bodyUnknown, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes", map[string]any{"templateID": unknown, "timeout": 60})
		if stTheirs == http.StatusCreated || stTheirs != stUnknown {
			t.Errorf("team B creating from team A's snapshot: %d %s; from an unknown one: %d %s", stTheirs, bodyTheirs, stUnknown, bodyUnknown)
		}
		// A Sandbox of team B's namespace that names it directly.
		thief := decode(t, direct)[0]
		thief.SetName("thief")
		thief.SetNamespace("team-b")
		thief.SetAnnotations(map[string]string{"agentbox.dev/snapshot": name})
		if err := c.Create(ctx, thief); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the thief refused", func() (bool, string) {
			got, err := getIn(ctx, c, "team-b", "thief")
			if err != nil {
				return false, err.Error()
			}
			rc := condition(got, "Ready")
			return rc != nil && rc.Reason == "SnapshotNotFound", fmtCond(rc)
		})
		if err := c.Delete(ctx, thief); err != nil {
			t.Fatal(err)
		}
	})

	// Measured, not asserted: a start from the snapshot on its own node
	// (the local copy, no bucket) is the floor of a start elsewhere.
	var localTook time.Duration
	t.Run("a sandbox starts from the local copy on node-a", func(t *testing.T) {
		start := time.Now()
		sbx, err := sdkA.Create(ctx, agentbox.CreateOptions{Template: snapID, Timeout: 5 * time.Minute})
		localTook = time.Since(start)
		if err != nil {
			t.Fatalf("create from snapshot %s on node-a: %v", snapID, err)
		}
		if n, err := nodeOfSandboxID(ctx, c, sbx.ID); err != nil || n != "node-a" {
			t.Errorf("sandbox from the snapshot on %q (%v), want node-a (the only agent)", n, err)
		}
		if res, err := sbx.Commands.Run(ctx, "cat /tmp/snap.txt"); err != nil || !strings.Contains(res.Stdout, "written before") {
			t.Errorf("file in the sandbox from the local copy: %v %+v", err, res)
		}
		if err := sbx.Kill(ctx); err != nil {
			t.Errorf("kill %s: %v", sbx.ID, err)
		}
	})

	b := agent("node-b", "32768")
	t.Cleanup(drain)
	// Placement ranks the Leases the agents' caches hold: wait for one
	// renewal of node-b's after its first write.
	var firstRenew string
	waitFor(ctx, t, "node-b's Lease to be renewed", func() (bool, string) {
		l := &unstructured.Unstructured{}
		l.SetGroupVersionKind(schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"})
		if err := c.Get(ctx, client.ObjectKey{Namespace: "agentbox-system", Name: "agentbox-node-node-b"}, l); err != nil {
			return false, err.Error()
		}
		renew, _, _ := unstructured.NestedString(l.Object, "spec", "renewTime")
		if firstRenew == "" {
			firstRenew = renew
		}
		return renew != firstRenew, "renewed " + renew
	})
	var restored *agentbox.Sandbox
	t.Run("a sandbox starts from it on node-b", func(t *testing.T) {
		start := time.Now()
		sbx, err := sdkA.Create(ctx, agentbox.CreateOptions{Template: snapID, Timeout: 10 * time.Minute})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("create from snapshot %s: %v", snapID, err)
		}
		if localTook > 0 {
			t.Logf("create from the snapshot through serve --kubernetes: on node-b from the bucket %v; on node-a from its local copy (floor) %v; ratio %.2f",
				took, localTook, took.Seconds()/localTook.Seconds())
		}
		restored = sbx
		if n, err := nodeOfSandboxID(ctx, c, sbx.ID); err != nil || n != "node-b" {
			t.Fatalf("restored sandbox on %q (%v), want node-b", n, err)
		}
		res, err := sbx.Commands.Run(ctx, `pid=$(cat /tmp/counter.pid); echo "$pid $(cut -d' ' -f2 /proc/$pid/stat)"; cat /tmp/snap.txt; cat /tmp/count; sleep 0.5; cat /tmp/count`)
		if err != nil {
			t.Fatalf("command in the restored sandbox: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(lines) != 4 || lines[0] != counter || lines[1] != "written before the snapshot" {
			t.Fatalf("restored on node-b: %q; want the counter %q alive and the file", res.Stdout, counter)
		}
		c1, _ := strconv.Atoi(lines[2])
		c2, _ := strconv.Atoi(lines[3])
		if c2 <= c1 {
			t.Errorf("counter %d then %d: want it to go on", c1, c2)
		}
		// The source runs on, on node-a.
		if res, err := src.Commands.Run(ctx, "cat /tmp/snap.txt"); err != nil || !strings.Contains(res.Stdout, "written before") {
			t.Errorf("source after the snapshot: %v %+v", err, res)
		}
	})

	t.Run("list with pagination and a named snapshot", func(t *testing.T) {
		st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "named-one"})
		if st != http.StatusCreated {
			t.Fatalf("named snapshot: %d %s", st, body)
		}
		var named snapshotInfo
		_ = json.Unmarshal(body, &named)
		if named.SnapshotID != "named-one:default" {
			t.Errorf("named snapshot id %q", named.SnapshotID)
		}
		st, body, h := callReplica(ctx, t, rep.URL, keyA, http.MethodGet, "/snapshots?limit=1&sandboxID="+src.ID, nil)
		first := snapshotIDs(t, body)
		if st != http.StatusOK || len(first) != 1 || h.Get("X-Next-Token") == "" {
			t.Fatalf("first page: %d %s next %q", st, body, h.Get("X-Next-Token"))
		}
		_, body, h = callReplica(ctx, t, rep.URL, keyA, http.MethodGet, "/snapshots?limit=1&sandboxID="+src.ID+"&nextToken="+h.Get("X-Next-Token"), nil)
		second := snapshotIDs(t, body)
		got := append(first, second...)
		slices.Sort(got)
		want := []string{"named-one:default", snapID}
		slices.Sort(want)
		if !slices.Equal(got, want) || h.Get("X-Next-Token") != "" {
			t.Errorf("pages %v (next %q), want %v", got, h.Get("X-Next-Token"), want)
		}
		if st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodDelete, "/templates/named-one", nil); st != http.StatusNoContent {
			t.Errorf("delete named snapshot: %d %s", st, body)
		}
	})

	t.Run("a tampered image restores nothing", func(t *testing.T) {
		// Sandboxes of team-a are not on the harness key's team: look at
		// node-b's sandbox and snapshot dirs.
		state := func() []string {
			var out []string
			for _, d := range []string{"sandboxes", "snapshots"} {
				entries, _ := os.ReadDir(filepath.Join(b.DataDir, d))
				for _, e := range entries {
					out = append(out, d+"/"+e.Name())
				}
			}
			return out
		}
		before := state()
		k := prefix + "image.tar"
		obj := readObject(ctx, t, raw, k)
		obj[len(obj)/2] ^= 0x01
		writeObject(ctx, t, raw, k, obj)
		_, err := sdkA.Create(ctx, agentbox.CreateOptions{Template: snapID, Timeout: time.Minute})
		if err == nil || !strings.Contains(err.Error(), "ImageIntegrityFailed") {
			t.Fatalf("create from a tampered snapshot: %v; want ImageIntegrityFailed", err)
		}
		// The failed restore's download dir goes with it.
		waitFor(ctx, t, "node-b to hold nothing new after a refused restore", func() (bool, string) {
			after := state()
			return slices.Equal(after, before), fmt.Sprintf("%v, before %v", after, before)
		})
	})

	t.Run("deleting it removes the objects and node-a's copy", func(t *testing.T) {
		if st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodDelete, "/templates/"+snapID, nil); st != http.StatusNoContent {
			t.Fatalf("delete snapshot: %d %s", st, body)
		}
		waitFor(ctx, t, "the SandboxSnapshot, its objects and node-a's copy to go", func() (bool, string) {
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(snapshotGVK)
			err := c.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: name}, obj)
			left := append(bucketKeys(ctx, t, raw, prefix), leftovers(a, localID)...)
			return err != nil && len(left) == 0, fmt.Sprintf("get: %v; left: %v", err, left)
		})
		if st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodGet, "/snapshots", nil); st != http.StatusOK || len(snapshotIDs(t, body)) != 0 {
			t.Errorf("list after the delete: %d %s", st, body)
		}
		if restored == nil {
			return
		}
		// The sandbox started from it runs on.
		if res, err := restored.Commands.Run(ctx, "cat /tmp/snap.txt"); err != nil || !strings.Contains(res.Stdout, "written before") {
			t.Errorf("restored sandbox after the delete: %v %+v", err, res)
		}
	})
}
