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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
)

// eventsIn lists "reason: note" of the events in namespace about name.
func eventsIn(ctx context.Context, t *testing.T, c client.Client, namespace, name string) []string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "events.k8s.io", Version: "v1", Kind: "EventList"})
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		reason, _, _ := unstructured.NestedString(e.Object, "reason")
		note, _, _ := unstructured.NestedString(e.Object, "note")
		who, _, _ := unstructured.NestedString(e.Object, "regarding", "name")
		if who == name {
			out = append(out, reason+": "+note)
		}
	}
	return out
}

// TestKubeNamespaceBinding starts an agent before a namespace is labelled
// agentbox.dev/team: labelling it binds it at once, and re-labelling or
// unlabelling it while it holds a team's Sandboxes leaves them with that
// team (no new Sandbox starts there, the namespace says why) until they
// are deleted; serve --kubernetes never shows them to the new team.
func TestKubeNamespaceBinding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, kcPath := cluster(ctx, t)
	const late = "late"
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	createTeamNamespace(ctx, t, c, late, nil)
	secret := filepath.Join(t.TempDir(), "token-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("0123456789abcdef", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	// No --kube-team at all: every binding comes from a label.
	a := harness.Start(t, harness.Name(t.Name()+"-node-a"), harness.Args("--kube-controller", "--kubeconfig", kcPath,
		"--kube-node", "node-a", "--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret))
	t.Cleanup(func() {
		if a.ProcessState() != nil {
			a.Launch(t)
		}
		labelNS(context.Background(), t, c, late, "team-a")
		drainTeamNamespaces(t, c, late)
	})
	rep := startReplica(t, a.Bin, kcPath, secret)
	keyA, keyB := mintKubeKey(t, a.Bin, kcPath, "team-a"), mintKubeKey(t, a.Bin, kcPath, "team-b")

	mk := func(name string) {
		t.Helper()
		u := decode(t, direct)[0]
		u.SetName(name)
		u.SetNamespace(late)
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	readyIn := func(name string) (id, team string) {
		t.Helper()
		waitFor(ctx, t, name+" Ready", func() (bool, string) {
			u, err := getIn(ctx, c, late, name)
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			id = status(u, "sandboxID")
			team = u.GetLabels()["agentbox.dev/team"]
			return rc != nil && rc.Status == metav1.ConditionTrue && id != "" && team != "", fmtCond(rc) + " team label " + team
		})
		return id, team
	}
	nsEvent := func(prefix string, contains ...string) {
		t.Helper()
		waitFor(ctx, t, "namespace event "+prefix, func() (bool, string) {
			evs := eventsIn(ctx, t, c, "default", late)
			for _, e := range evs {
				if strings.HasPrefix(e, prefix) && !slices.ContainsFunc(contains, func(s string) bool { return !strings.Contains(e, s) }) {
					return true, ""
				}
			}
			return false, strings.Join(evs, " | ")
		})
	}
	listIDs := func(key string) []string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", rep.URL+"/v2/sandboxes", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list []struct {
			SandboxID string `json:"sandboxID"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatalf("list: %d %v", resp.StatusCode, err)
		}
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.SandboxID)
		}
		return ids
	}

	// A Sandbox in the unlabelled namespace waits; the label binds it live.
	mk("first")
	labelNS(ctx, t, c, late, "team-a")
	idA, team := readyIn("first")
	if team != "team-a" {
		t.Fatalf("first is labelled team %q, want team-a", team)
	}
	nsEvent("TeamBound: ", "team-a")
	waitFor(ctx, t, "team A to list its sandbox through the replica", func() (bool, string) {
		ids := listIDs(keyA)
		return slices.Contains(ids, idA), fmt.Sprint(ids)
	})

	t.Run("a re-label keeps the old team's sandboxes with it", func(t *testing.T) {
		labelNS(ctx, t, c, late, "team-b")
		nsEvent("TeamRebindRefused: ", "team-b", "holds Sandboxes of team team-a")
		mk("newcomer")
		waitFor(ctx, t, "newcomer refused", func() (bool, string) {
			u, err := getIn(ctx, c, late, "newcomer")
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			return rc != nil && rc.Reason == "TeamRebinding" && strings.Contains(rc.Message, "team-a") && status(u, "sandboxID") == "", fmtCond(rc)
		})
		// first still runs, still team A's, and team B never sees it.
		if u, _ := getIn(ctx, c, late, "first"); u.GetLabels()["agentbox.dev/team"] != "team-a" || condition(u, "Ready").Status != metav1.ConditionTrue {
			t.Errorf("first after the re-label: team %q, %s", u.GetLabels()["agentbox.dev/team"], fmtCond(condition(u, "Ready")))
		}
		if ids := listIDs(keyB); len(ids) != 0 {
			t.Errorf("team B lists %v in a namespace still holding team A's sandbox", ids)
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", rep.URL+"/sandboxes/"+idA, nil)
		req.Header.Set("X-API-Key", keyB)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("team B GET /sandboxes/%s: %d, want 404", idA, resp.StatusCode)
		}

		// Once team A's Sandbox is gone the namespace is team B's.
		if err := c.Delete(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "first", "namespace": late}}}); err != nil {
			t.Fatal(err)
		}
		nsEvent("TeamBound: ", "team-b")
		_, team := readyIn("newcomer")
		if team != "team-b" {
			t.Errorf("newcomer is labelled team %q, want team-b", team)
		}
	})

	t.Run("unlabelled while it holds sandboxes, it stays bound until they go", func(t *testing.T) {
		labelNS(ctx, t, c, late, "")
		nsEvent("TeamRebindRefused: ", "no longer labelled", "team-b")
		if u, _ := getIn(ctx, c, late, "newcomer"); condition(u, "Ready").Status != metav1.ConditionTrue {
			t.Errorf("newcomer after the unlabel: %s", fmtCond(condition(u, "Ready")))
		}
		if err := c.Delete(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "newcomer", "namespace": late}}}); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "newcomer deleted", func() (bool, string) {
			_, err := getIn(ctx, c, late, "newcomer")
			return err != nil, fmt.Sprint(err)
		})
		nsEvent("TeamUnbound: ", "team-b")
	})
}

// labelNS sets (or with team "" removes) a namespace's agentbox.dev/team.
func labelNS(ctx context.Context, t *testing.T, c client.Client, name, team string) {
	t.Helper()
	val := "null"
	if team != "" {
		val = `"` + team + `"`
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"})
	u.SetName(name)
	if err := c.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"agentbox.dev/team":`+val+`}}}`))); err != nil {
		t.Fatal(err)
	}
}
