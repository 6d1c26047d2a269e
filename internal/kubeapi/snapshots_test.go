package kubeapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/kube"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestSnapshotKey(t *testing.T) {
	for _, tc := range []struct{ ref, want string }{
		{"snapabc:default", "snapabc"}, {"snapabc", "snapabc"}, {"team/named-one:v1", "named-one"}, {":default", ""}, {"", ""},
	} {
		if got := snapshotKey(tc.ref); got != tc.want {
			t.Errorf("snapshotKey(%q) = %q, want %q", tc.ref, got, tc.want)
		}
	}
}

// TestSnapshotsAgainstAPIServer checks the CRD's validation and that the
// snapshot routes see only the caller's namespaces (no agents: snapshots
// are made Ready by hand).
func TestSnapshotsAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c, hs := apiServer(t)
	ctx := t.Context()

	t.Run("the CRD refuses bad specs naming the field", func(t *testing.T) {
		for _, tc := range []struct {
			spec abv1.SandboxSnapshotSpec
			want string
		}{
			{abv1.SandboxSnapshotSpec{}, "spec.sandboxRef.name"},
			{abv1.SandboxSnapshotSpec{SandboxRef: abv1.SandboxRef{Name: "x"}, Name: "Bad Name"}, "spec.name"},
		} {
			s := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{GenerateName: "bad-", Namespace: "team-a"}, Spec: tc.spec}
			err := c.Create(ctx, s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("spec %+v: %v, want an error naming %s", tc.spec, err, tc.want)
			}
		}
		s := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "immutable", Namespace: "team-a"}, Spec: abv1.SandboxSnapshotSpec{SandboxRef: abv1.SandboxRef{Name: "x"}}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		s.Spec.SandboxRef.Name = "y"
		if err := c.Update(ctx, s); err == nil || !strings.Contains(err.Error(), "immutable") {
			t.Errorf("spec change: %v, want refused as immutable", err)
		}
		if err := c.Delete(ctx, s); err != nil {
			t.Fatal(err)
		}
	})

	// Three Ready snapshots of team A, as an agent would have made them.
	for i, name := range []string{"snapa1", "snapa2", "snapa3"} {
		s := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"}, Spec: abv1.SandboxSnapshotSpec{SandboxRef: abv1.SandboxRef{Name: "src"}}}
		if i == 2 {
			s.Spec.Name = "named"
		}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		s.Status = abv1.SandboxSnapshotStatus{Phase: abv1.PhaseReady, SnapshotID: "snaplocal" + name, Team: "a", SandboxID: "isrc", NodeName: "node-x", Template: "base"}
		if err := c.Status().Update(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	list := func(key, query string) []string {
		t.Helper()
		st, body := call(t, hs, key, "GET", "/snapshots"+query, "")
		if st != 200 {
			t.Fatalf("list: %d %s", st, body)
		}
		var got []struct {
			SnapshotID string `json:"snapshotID"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range got {
			out = append(out, s.SnapshotID)
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(list("e2b_keya", "")) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("team A lists %v", list("e2b_keya", ""))
		}
		time.Sleep(100 * time.Millisecond)
	}

	t.Run("another team's snapshot answers like an unknown one", func(t *testing.T) {
		if got := list("e2b_keyb", ""); len(got) != 0 {
			t.Errorf("team B lists %v", got)
		}
		for _, ref := range []string{"snapa1:default", "named:default", "snapunknown:default"} {
			if st, body := call(t, hs, "e2b_keyb", "DELETE", "/templates/"+ref, ""); st != 404 {
				t.Errorf("team B deletes %s: %d %s", ref, st, body)
			}
		}
	})

	t.Run("filters and pages", func(t *testing.T) {
		if got := list("e2b_keya", "?name=named"); len(got) != 1 || got[0] != "named:default" {
			t.Errorf("by name: %v", got)
		}
		if got := list("e2b_keya", "?sandboxID=iother"); len(got) != 0 {
			t.Errorf("of another sandbox: %v", got)
		}
		seen := map[string]bool{}
		token := ""
		for range 3 {
			req := "?limit=2"
			if token != "" {
				req += "&nextToken=" + token
			}
			got := list("e2b_keya", req)
			for _, id := range got {
				seen[id] = true
			}
			if token = nextToken(t, hs, "e2b_keya", "/snapshots"+req); token == "" {
				break
			}
		}
		if len(seen) != 3 {
			t.Errorf("pages saw %v, want 3 snapshots", seen)
		}
	})

	t.Run("bad requests name the field", func(t *testing.T) {
		for _, tc := range []struct{ path, body, want string }{
			{"/snapshots?limit=0", "", "limit"},
			{"/sandboxes/isrc/snapshots", `{"name":"Bad Name"}`, "name"},
		} {
			method := "POST"
			if strings.HasPrefix(tc.path, "/snapshots") {
				method = "GET"
			}
			if st, body := call(t, hs, "e2b_keya", method, tc.path, tc.body); st != 400 || !strings.Contains(body, tc.want) {
				t.Errorf("%s %s: %d %s, want 400 naming %s", method, tc.path, st, body, tc.want)
			}
		}
	})

	t.Run("the owner deletes by name", func(t *testing.T) {
		if st, body := call(t, hs, "e2b_keya", "DELETE", "/templates/named:default", ""); st != 204 {
			t.Fatalf("delete: %d %s", st, body)
		}
		var s abv1.SandboxSnapshot
		if err := c.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "snapa3"}, &s); err == nil && s.DeletionTimestamp.IsZero() {
			t.Errorf("snapa3 still there")
		}
	})
}

// TestSnapshotRelabel re-labels the namespace of team A's snapshots for
// team C: they stay team A's (listed, deleted by A), C neither lists,
// deletes nor starts from them, and the namespace is not C's for new
// sandboxes while they are there.
func TestSnapshotRelabel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c, hs := apiServer(t)
	ctx := t.Context()
	for _, name := range []string{"snapa1", "snapa2"} {
		s := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"}, Spec: abv1.SandboxSnapshotSpec{SandboxRef: abv1.SandboxRef{Name: "src"}}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		s.Status = abv1.SandboxSnapshotStatus{Phase: abv1.PhaseReady, SnapshotID: "snaplocal" + name, Team: "a", SandboxID: "isrc", NodeName: "node-x", Template: "base"}
		if err := c.Status().Update(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	keyC := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key-c", Namespace: "agentbox-system", Labels: map[string]string{kube.LabelTeam: "c"}},
		Type: SecretType, Data: map[string][]byte{KeyHashField: []byte(HashKey("e2b_keyc"))}}
	if err := c.Create(ctx, keyC); err != nil {
		t.Fatal(err)
	}
	ids := func(key string) []string {
		t.Helper()
		st, body := call(t, hs, key, "GET", "/snapshots", "")
		if st != 200 {
			t.Fatalf("list: %d %s", st, body)
		}
		var got []struct {
			SnapshotID string `json:"snapshotID"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range got {
			out = append(out, s.SnapshotID)
		}
		slices.Sort(out)
		return out
	}
	waitUntil := func(what string, f func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			ok, last := f()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s", what, last)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitUntil("team A lists its two snapshots", func() (bool, string) {
		got := ids("e2b_keya")
		return len(got) == 2, fmt.Sprint(got)
	})
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: "team-a"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels[kube.LabelTeam] = "c"
	if err := c.Update(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	// The replica saw the re-label once team C, which has no other
	// namespace, is told the namespace is still held.
	create := `{"templateID":"base","timeout":30}`
	waitUntil("team C told namespace team-a is still team A's", func() (bool, string) {
		st, body := call(t, hs, "e2b_keyc", "POST", "/sandboxes", create)
		return st == 409 && strings.Contains(body, "team-a") && strings.Contains(body, "of team a"), fmt.Sprint(st, " ", body)
	})

	if got := ids("e2b_keyc"); len(got) != 0 {
		t.Errorf("team C lists team A's snapshots after the re-label: %v", got)
	}
	for _, ref := range []string{"snapa1:default", "snapa2"} {
		if st, body := call(t, hs, "e2b_keyc", "DELETE", "/templates/"+ref, ""); st != 404 {
			t.Errorf("team C deletes %s: %d %s", ref, st, body)
		}
	}
	stTheirs, bodyTheirs := call(t, hs, "e2b_keyc", "POST", "/sandboxes", `{"templateID":"snapa1:default","timeout":30}`)
	stUnknown, bodyUnknown := call(t, hs, "e2b_keyc", "POST", "/sandboxes", `{"templateID":"snapzzzz:default","timeout":30}`)
	if stTheirs == 201 || stTheirs != stUnknown || bodyTheirs != bodyUnknown {
		t.Errorf("team C starts from team A's snapshot: %d %s; from an unknown one: %d %s", stTheirs, bodyTheirs, stUnknown, bodyUnknown)
	}
	var sb agentsv1.SandboxList
	if err := c.List(ctx, &sb, client.InNamespace("team-a")); err != nil || len(sb.Items) != 0 {
		t.Errorf("Sandboxes in team-a after team C's creates: %d (%v)", len(sb.Items), err)
	}

	// Team A keeps them: it lists and deletes them.
	if got := ids("e2b_keya"); !slices.Equal(got, []string{"snapa1:default", "snapa2:default"}) {
		t.Errorf("team A lists %v after the re-label", got)
	}
	for _, name := range []string{"snapa1", "snapa2"} {
		if st, body := call(t, hs, "e2b_keya", "DELETE", "/templates/"+name+":default", ""); st != 204 {
			t.Errorf("team A deletes %s after the re-label: %d %s", name, st, body)
		}
	}
}

// nextToken is the X-Next-Token of a GET.
func nextToken(t *testing.T, hs *httptest.Server, key, path string) string {
	t.Helper()
	req, err := http.NewRequest("GET", hs.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("X-Next-Token")
}
