package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestKubeSnapshotOwnership attacks a team's SandboxSnapshot from another
// team through serve --kubernetes: a snapshot records the team that took
// it, and re-labelling its namespace for team B while it holds the snapshot
// hands B nothing (B neither lists, deletes nor starts from it, not even
// with a Sandbox of its own in that namespace); team A keeps it, and the
// namespace passes to B once A deletes it.
func TestKubeSnapshotOwnership(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)
	const own = "own-a"
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	createTeamNamespace(ctx, t, c, own, map[string]any{"agentbox.dev/team": "team-a"})
	secret := filepath.Join(t.TempDir(), "token-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("0123456789abcdef", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	a := harness.Start(t, harness.Name(t.Name()+"-node-a"), harness.Args("--kube-controller", "--kubeconfig", kcPath,
		"--kube-node", "node-a", "--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret))
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		for _, ns := range []string{own, "own-b"} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(snapshotGVK)
			if err := c.DeleteAllOf(dctx, u, client.InNamespace(ns)); err != nil {
				t.Errorf("delete SandboxSnapshots in %s: %v", ns, err)
			}
		}
		drainTeamNamespaces(t, c, own, "own-b")
	})
	rep := startReplica(t, a.Bin, kcPath, secret)
	keyA, keyB := mintKubeKey(t, a.Bin, kcPath, "team-a"), mintKubeKey(t, a.Bin, kcPath, "team-b")
	sdkA := agentbox.New(agentbox.WithAPIURL(rep.URL), agentbox.WithSandboxURL(rep.URL), agentbox.WithAPIKey(keyA))

	src, err := sdkA.Create(ctx, agentbox.CreateOptions{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("create through the replica: %v", err)
	}
	if _, err := src.Commands.Run(ctx, "echo team-a-secret > /tmp/secret.txt"); err != nil {
		t.Fatal(err)
	}
	st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]any{})
	if st != http.StatusCreated {
		t.Fatalf("create snapshot: %d %s", st, body)
	}
	var info snapshotInfo
	if err := json.Unmarshal(body, &info); err != nil || info.SnapshotID == "" {
		t.Fatalf("create snapshot answer: %v %s", err, body)
	}
	snapID := info.SnapshotID
	name, _, _ := strings.Cut(snapID, ":")
	if team, _, _ := unstructured.NestedString(snapshotObject(ctx, t, c, own, snapID).Object, "status", "team"); team != "team-a" {
		t.Fatalf("SandboxSnapshot status.team %q, want team-a (the team that took it)", team)
	}
	// Only the snapshot holds the namespace from here on.
	if err := src.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the source Sandbox to go", func() (bool, string) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(sandboxGVK.GroupVersion().WithKind("SandboxList"))
		if err := c.List(ctx, list, client.InNamespace(own)); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})

	labelNS(ctx, t, c, own, "team-b")
	waitFor(ctx, t, "the agent to refuse the re-label", func() (bool, string) {
		evs := eventsIn(ctx, t, c, "default", own)
		return slices.ContainsFunc(evs, func(e string) bool {
			return strings.HasPrefix(e, "TeamRebindRefused: ") && strings.Contains(e, "holds SandboxSnapshots of team team-a")
		}), strings.Join(evs, " | ")
	})
	// Team B has no other namespace: the replica saw the re-label once it
	// tells B the namespace is still team A's.
	waitFor(ctx, t, "the replica to refuse team B the namespace", func() (bool, string) {
		st, body, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 60})
		return st == http.StatusConflict && strings.Contains(string(body), "still holds") && strings.Contains(string(body), "team-a"), fmt.Sprint(st, " ", string(body))
	})

	t.Run("attack: team B lists team A's snapshot in the re-labelled namespace", func(t *testing.T) {
		st, body, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodGet, "/snapshots", nil)
		if st != http.StatusOK || len(snapshotIDs(t, body)) != 0 {
			t.Errorf("team B lists: %d %s", st, body)
		}
	})
	t.Run("attack: team B deletes team A's snapshot in the re-labelled namespace", func(t *testing.T) {
		for _, ref := range []string{snapID, name} {
			if st, body, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodDelete, "/templates/"+ref, nil); st != http.StatusNotFound {
				t.Errorf("team B deletes %s: %d %s", ref, st, body)
			}
		}
		snapshotObject(ctx, t, c, own, snapID) // still there
	})
	t.Run("attack: team B starts a Sandbox of its own from team A's snapshot", func(t *testing.T) {
		// Through the API, from B's own namespace: as for an unknown id.
		createTeamNamespace(ctx, t, c, "own-b", map[string]any{"agentbox.dev/team": "team-b"})
		var stTheirs int
		var bodyTheirs []byte
		waitFor(ctx, t, "team B's own namespace to be served", func() (bool, string) {
			stTheirs, bodyTheirs, _ = callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes", map[string]any{"templateID": snapID, "timeout": 60})
			return !strings.Contains(string(bodyTheirs), "still holds"), fmt.Sprint(stTheirs, " ", string(bodyTheirs))
		})
		unknown := "snap" + strings.Repeat("z", 20) + ":default"
		stUnknown, bodyUnknown, _ := callReplica(ctx, t, rep.URL, keyB, http.MethodPost, "/sandboxes", map[string]any{"templateID": unknown, "timeout": 60})
		if stTheirs == http.StatusCreated || stTheirs != stUnknown {
			t.Errorf("team B creating from team A's snapshot: %d %s; from an unknown one: %d %s", stTheirs, bodyTheirs, stUnknown, bodyUnknown)
		}
		// A Sandbox written straight into the re-labelled namespace.
		thief := decode(t, direct)[0]
		thief.SetName("thief")
		thief.SetNamespace(own)
		thief.SetAnnotations(map[string]string{"agentbox.dev/snapshot": name})
		if err := c.Create(ctx, thief); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the thief refused", func() (bool, string) {
			got, err := getIn(ctx, c, own, "thief")
			if err != nil {
				return false, err.Error()
			}
			rc := condition(got, "Ready")
			return rc != nil && rc.Reason == "TeamRebinding" && status(got, "sandboxID") == "", fmtCond(rc)
		})
		if err := c.Delete(ctx, thief); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the thief deleted", func() (bool, string) {
			_, err := getIn(ctx, c, own, "thief")
			return err != nil, fmt.Sprint(err)
		})
	})

	t.Run("team A keeps it and deletes it; then the namespace is team B's", func(t *testing.T) {
		st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodGet, "/snapshots", nil)
		if ids := snapshotIDs(t, body); st != http.StatusOK || !slices.Contains(ids, snapID) {
			t.Fatalf("team A lists after the re-label: %d %s", st, body)
		}
		if st, body, _ := callReplica(ctx, t, rep.URL, keyA, http.MethodDelete, "/templates/"+snapID, nil); st != http.StatusNoContent {
			t.Fatalf("team A deletes its snapshot after the re-label: %d %s", st, body)
		}
		waitFor(ctx, t, "namespace bound to team B", func() (bool, string) {
			evs := eventsIn(ctx, t, c, "default", own)
			return slices.ContainsFunc(evs, func(e string) bool {
				return strings.HasPrefix(e, "TeamBound: ") && strings.Contains(e, "team-b")
			}), strings.Join(evs, " | ")
		})
	})
}
