package kube

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/sandbox"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// getSnapshot reads SandboxSnapshot ns/name.
func getSnapshot(ctx context.Context, c client.Client, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(snapshotGVK)
	return u, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u)
}

// newSnapshot makes SandboxSnapshot ns/name of Sandbox source.
func newSnapshot(ctx context.Context, t *testing.T, c client.Client, name, source string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(snapshotGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	if err := unstructured.SetNestedField(u.Object, source, "spec", "sandboxRef", "name"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
}

// deleteSnapshot deletes SandboxSnapshot ns/name and, unless nowait, waits
// until its agent removed its finalizer (its copies are gone).
func deleteSnapshot(ctx context.Context, t *testing.T, c client.Client, name string, nowait bool) {
	t.Helper()
	u, err := getSnapshot(ctx, c, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	if !nowait {
		waitSnapshotGone(ctx, t, c, name)
	}
}

func waitSnapshotGone(ctx context.Context, t *testing.T, c client.Client, name string) {
	t.Helper()
	waitFor(ctx, t, "SandboxSnapshot "+name+" deleted", func() (bool, string) {
		_, err := getSnapshot(ctx, c, name)
		return err != nil, fmt.Sprint(err)
	})
}

// stored reports whether SandboxSnapshot u is Ready with its image stored.
func stored(u *unstructured.Unstructured) (bool, string) {
	rc := condition(u, "Ready")
	loc := status(u, "location")
	return status(u, "phase") == "Ready" && loc == kube.SnapshotPrefix(ns, u.GetName()) && rc != nil && rc.Reason == "Stored",
		status(u, "phase") + " at " + loc + ": " + fmtCond(rc)
}

// TestKubeSnapshotCrash crashes a node agent after every named step of
// storing a SandboxSnapshot (kube.SnapshotCrashSteps: the sandbox manager
// taking it on the source's node, the agent recording, exporting, uploading
// it) and of starting a Sandbox from it on another node (downloading,
// placing, the restore pipeline, recording the sandbox), starts the agent
// again, and checks: a store finishes (Ready, stored, its status says so)
// and the snapshot restores with its files, its process and that process's
// memory; a restore leaves exactly one working sandbox on its node; and
// once the objects are deleted neither node nor the bucket holds anything
// of them (containers, mounts, cgroups, netns, rows, snapshot dirs,
// staging dirs, objects). Three rows then crash mid-store or mid-restore
// and delete the SandboxSnapshot or the Sandbox before its node returns:
// the copies and the sandbox nothing recorded must still go. The restore
// steps run again from the snapshot node's own copy (restore-local/, node-b
// stopped), and a last row crashes after the take, then deletes the source
// and the SandboxSnapshot while node-a is down (node-b lets the object go):
// node-a's copy must still go on its return. One cluster set-up serves
// every row; $CRASH_POINT narrows the table to the rows containing it.
func TestKubeSnapshotCrash(t *testing.T) {
	harness.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c, raw, agent := bucketAgents(ctx, t)
	sdkOf := func(s *harness.Server) *agentbox.Client {
		return agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	}
	// node-a alone first, so the source runs there; node-b, with more
	// room, joins and every Sandbox started from a snapshot lands on it,
	// restoring from the bucket.
	a := agent("node-a", "--kube-node-cpu", "4", "--kube-node-memory-mb", "4096")
	t.Cleanup(func() { drain(t, c) })
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(snapshotGVK)
		_ = c.DeleteAllOf(dctx, u, client.InNamespace(ns))
		waitFor(dctx, t, "every SandboxSnapshot to go", func() (bool, string) {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(snapshotGVK.GroupVersion().WithKind("SandboxSnapshotList"))
			if err := c.List(dctx, list, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
		})
	})
	const source = "snap-crash-source"
	u := decode(t, direct)[0]
	u.SetName(source)
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	srcID := waitReady(ctx, t, c, source)
	sbx, err := sdkOf(a).Connect(ctx, srcID, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A counter that lives only in a shell's memory, and a file.
	res, err := sbx.Commands.Run(ctx, `sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &
echo $! > /tmp/counter.pid; echo 'written before the snapshot' > /tmp/snap.txt; sleep 0.3; cat /tmp/counter.pid`)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(res.Stdout)
	b := agent("node-b", "--kube-node-cpu", "16", "--kube-node-memory-mb", "32768")

	// arm relaunches both agents with the crash point, except those
	// named down, which it stops.
	arm := func(t *testing.T, point string, down ...*harness.Server) *moveRig {
		m := &moveRig{ctx: ctx, t: t, a: a, b: b, down: map[*harness.Server]bool{}}
		for _, s := range []*harness.Server{a, b} {
			select {
			case <-s.Exited():
			default:
				s.Terminate(t)
			}
			if slices.Contains(down, s) {
				m.down[s] = true
			} else if point == "" {
				s.Launch(t)
			} else {
				s.Launch(t, "--test-crash-after", point)
			}
		}
		return m
	}
	// restoreOn starts Sandbox name from SandboxSnapshot snap, waits
	// until it is Ready on node (on: its agent) and the row's crash
	// happened, and checks it is whole there: its file, its counter alive
	// with its pid and counting on from its memory.
	restoreOn := func(t *testing.T, m *moveRig, name, snap string, on *harness.Server, node string) string {
		t.Helper()
		u := decode(t, direct)[0]
		u.SetName(name)
		u.SetAnnotations(map[string]string{kube.AnnotationSnapshot: snap})
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		var id string
		m.wait(name+" Ready on "+node, func() (bool, string) {
			u, err := getIn(ctx, c, ns, name)
			if err != nil {
				return false, err.Error()
			}
			rc := condition(u, "Ready")
			id = status(u, "sandboxID")
			return rc != nil && rc.Status == metav1.ConditionTrue && status(u, "nodeName") == node && id != "" && len(m.crashes) > 0,
				fmtCond(rc) + " on " + status(u, "nodeName") + fmt.Sprintf("; agents crashed: %v", m.crashes)
		})
		sbx, err := sdkOf(on).Connect(ctx, id, 10*time.Minute)
		if err != nil {
			t.Fatalf("connect to %s on %s: %v", id, node, err)
		}
		res, err := sbx.Commands.Run(ctx, `cat /tmp/counter.pid; kill -0 $(cat /tmp/counter.pid) && echo alive; cat /tmp/snap.txt; cat /tmp/count; sleep 0.5; cat /tmp/count`)
		if err != nil {
			t.Fatalf("command in %s on %s: %v", id, node, err)
		}
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(lines) != 5 || lines[0] != pid || lines[1] != "alive" || lines[2] != "written before the snapshot" {
			t.Fatalf("started from %s on %s: %q; want the counter %s alive and the file", snap, node, res.Stdout, pid)
		}
		c1, _ := strconv.Atoi(lines[3])
		c2, _ := strconv.Atoi(lines[4])
		if c1 < 1 || c2 <= c1 {
			t.Errorf("counter %d then %d: want it to go on from its memory", c1, c2)
		}
		if node == "node-b" {
			if ids := sandboxesOf(ctx, t, b); len(ids) != 1 || ids[0] != id {
				t.Errorf("node-b runs %v, want only %s", ids, id)
			}
		} else if ids := sandboxesOf(ctx, t, on); len(ids) != 2 || !slices.Contains(ids, id) || !slices.Contains(ids, srcID) {
			t.Errorf("%s runs %v, want only the source %s and %s", node, ids, srcID, id)
		}
		return id
	}
	restoreFrom := func(t *testing.T, m *moveRig, name, snap string) string {
		t.Helper()
		return restoreOn(t, m, name, snap, b, "node-b")
	}
	// settle checks that neither node holds anything the row made. node-b
	// restarts first: a sandbox started from a snapshot runs on a hidden
	// copy of it that the sandbox manager collects on its next pass (every
	// 30 s) or at start, where a crashed agent's restart collects it too.
	settle := func(t *testing.T, beforeA, beforeB harness.HostState) {
		t.Helper()
		b.Terminate(t)
		b.Launch(t)
		a.WaitNoLeaks(t, beforeA)
		b.WaitNoLeaks(t, beforeB)
	}
	oneCrash := func(t *testing.T, m *moveRig, point string, node *harness.Server) {
		t.Helper()
		if len(m.crashes) != 1 || m.crashes[0] != node.Instance {
			t.Fatalf("agents killed at %s: %v; want exactly one crash there, of %s", point, m.crashes, node.Instance)
		}
	}
	only := os.Getenv("CRASH_POINT")
	store, restore := kube.SnapshotCrashSteps()
	for i, point := range store {
		if only != "" && !strings.Contains(point.String(), only) {
			continue
		}
		t.Run("store/"+point.String(), func(t *testing.T) {
			m := arm(t, point.String())
			start := time.Now()
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := fmt.Sprintf("snap-crash-%d", i)
			newSnapshot(ctx, t, c, name, source)
			// After the crash: a step's status write comes before its
			// crash point, so the status alone may say stored too early.
			m.wait(name+" Ready and stored after the crash", func() (bool, string) {
				u, err := getSnapshot(ctx, c, name)
				if err != nil {
					return false, err.Error()
				}
				ok, why := stored(u)
				return ok && len(m.crashes) > 0, fmt.Sprintf("%s; agents crashed: %v", why, m.crashes)
			})
			oneCrash(t, m, point.String(), a)
			storedAt := time.Now()
			restoreFrom(t, m, name+"-r", name)
			restored := time.Now()
			deleteAndWait(ctx, t, c, ns, name+"-r")
			deleteSnapshot(ctx, t, c, name, false)
			t.Logf("stored %s after the crash, restored in %s, deleted in %s", storedAt.Sub(start).Round(time.Millisecond), restored.Sub(storedAt).Round(time.Millisecond), time.Since(restored).Round(time.Millisecond))
			if left := bucketKeys(ctx, t, raw, ns+"/"); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the delete", left)
			}
			settle(t, beforeA, beforeB)
		})
	}

	// A crash mid-store, and the SandboxSnapshot deleted before its node
	// returns: the local copy or the objects no status names must go.
	for _, point := range []sandbox.CrashStep{
		{Op: kube.OpSnapshotStore, Step: kube.SnapshotTake},
		{Op: kube.OpSnapshotStore, Step: kube.SnapshotUpload},
	} {
		row := "store/" + point.String() + " then delete"
		if only != "" && !strings.Contains(row, only) {
			continue
		}
		t.Run(row, func(t *testing.T) {
			arm(t, point.String())
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := "snap-crash-then-delete-" + strings.ReplaceAll(point.Step, " ", "-")
			newSnapshot(ctx, t, c, name, source)
			select {
			case <-a.Exited():
			case <-time.After(waitLimit):
				t.Fatalf("node-a did not crash at %s in %s", point, waitLimit)
			}
			if ps := a.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
				t.Fatalf("node-a exited with %v, want SIGKILL at the crash point:\n%s", ps, a.LogTail(30))
			}
			u, err := getSnapshot(ctx, c, name)
			if err != nil {
				t.Fatal(err)
			}
			// Else the row would prove nothing: a copy exists that the
			// status does not name.
			switch point.Step {
			case kube.SnapshotTake:
				if status(u, "snapshotID") != "" {
					t.Fatalf("the snapshot is recorded although node-a crashed before the record step: %v", u.Object["status"])
				}
				if !slices.ContainsFunc(beforeA.Leaked(a.HostState(ctx)), func(s string) bool { return strings.HasPrefix(s, harness.KindFile+": snapshots/") }) {
					t.Fatalf("node-a crashed after %s with no snapshot in its data dir", point)
				}
			case kube.SnapshotUpload:
				if status(u, "location") != "" {
					t.Fatalf("the location is recorded although node-a crashed before recording it: %v", u.Object["status"])
				}
				if len(bucketKeys(ctx, t, raw, kube.SnapshotPrefix(ns, name))) == 0 {
					t.Fatalf("node-a crashed after %s with nothing under %s", point, kube.SnapshotPrefix(ns, name))
				}
			}
			deleteSnapshot(ctx, t, c, name, true)
			a.Launch(t)
			waitSnapshotGone(ctx, t, c, name)
			if left := bucketKeys(ctx, t, raw, ns+"/"); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the delete", left)
			}
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}

	// Every restore row starts from one stored snapshot.
	shared := "snap-crash-shared"
	arm(t, "")
	newSnapshot(ctx, t, c, shared, source)
	waitFor(ctx, t, shared+" Ready and stored", func() (bool, string) {
		u, err := getSnapshot(ctx, c, shared)
		if err != nil {
			return false, err.Error()
		}
		return stored(u)
	})
	sharedKeys := bucketKeys(ctx, t, raw, ns+"/")
	for i, point := range restore {
		if only != "" && !strings.Contains(point.String(), only) {
			continue
		}
		t.Run("restore/"+point.String(), func(t *testing.T) {
			m := arm(t, point.String())
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := fmt.Sprintf("snap-crash-restore-%d", i)
			restoreFrom(t, m, name, shared)
			oneCrash(t, m, point.String(), b)
			u, _ := getIn(ctx, c, ns, name)
			if rc := condition(u, "Ready"); rc == nil || rc.Status != metav1.ConditionTrue {
				t.Errorf("Ready after the restore: %s", fmtCond(rc))
			}
			deleteAndWait(ctx, t, c, ns, name)
			if left := bucketKeys(ctx, t, raw, ns+"/"); !slices.Equal(left, sharedKeys) {
				t.Errorf("the bucket holds %v after the delete, want only the snapshot's %v", left, sharedKeys)
			}
			settle(t, beforeA, beforeB)
		})
	}
	// A crash right after the import, and the Sandbox deleted before its
	// node returns: the sandbox no status names must go with it.
	imp := sandbox.CrashStep{Op: kube.OpSnapshotRestore, Step: kube.SnapshotImport}
	if row := "restore/" + imp.String() + " then delete"; only == "" || strings.Contains(row, only) {
		t.Run(row, func(t *testing.T) {
			arm(t, imp.String())
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := "snap-crash-restore-then-delete"
			u := decode(t, direct)[0]
			u.SetName(name)
			u.SetAnnotations(map[string]string{kube.AnnotationSnapshot: shared})
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			select {
			case <-b.Exited():
			case <-time.After(waitLimit):
				t.Fatalf("node-b did not crash at %s in %s", imp, waitLimit)
			}
			if ps := b.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
				t.Fatalf("node-b exited with %v, want SIGKILL at the crash point:\n%s", ps, b.LogTail(30))
			}
			// Else the row would prove nothing: a sandbox runs that the
			// status does not name.
			if u, err := getIn(ctx, c, ns, name); err != nil || status(u, "sandboxID") != "" {
				t.Fatalf("after the crash at %s: %v, sandboxID %q; want it unrecorded", imp, err, status(u, "sandboxID"))
			}
			if !slices.ContainsFunc(beforeB.Leaked(b.HostState(ctx)), func(s string) bool { return strings.HasPrefix(s, harness.KindContainer+": ") }) {
				t.Fatalf("node-b crashed after %s with no sandbox running", imp)
			}
			u, err := getIn(ctx, c, ns, name)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, u); err != nil {
				t.Fatal(err)
			}
			b.Launch(t)
			waitGone(ctx, t, c, ns, name)
			if left := bucketKeys(ctx, t, raw, ns+"/"); !slices.Equal(left, sharedKeys) {
				t.Errorf("the bucket holds %v after the delete, want only the snapshot's %v", left, sharedKeys)
			}
			settle(t, beforeA, beforeB)
		})
	}
	// The same steps from the snapshot node's own copy: node-b is
	// stopped, so the Sandbox lands on node-a, whose agent crashes.
	for i, point := range restore {
		row := "restore-local/" + point.String()
		if only != "" && !strings.Contains(row, only) {
			continue
		}
		t.Run(row, func(t *testing.T) {
			m := arm(t, point.String(), b)
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := fmt.Sprintf("snap-crash-local-%d", i)
			restoreOn(t, m, name, shared, a, "node-a")
			oneCrash(t, m, point.String(), a)
			deleteAndWait(ctx, t, c, ns, name)
			if left := bucketKeys(ctx, t, raw, ns+"/"); !slices.Equal(left, sharedKeys) {
				t.Errorf("the bucket holds %v after the delete, want only the snapshot's %v", left, sharedKeys)
			}
			// node-a restarts: it collects the hidden copy the sandbox ran on.
			a.Terminate(t)
			a.Launch(t)
			b.Launch(t)
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}
	if only == "" {
		deleteSnapshot(ctx, t, c, shared, false)
		if left := bucketKeys(ctx, t, raw, ""); len(left) != 0 {
			t.Errorf("the bucket keeps %v after every snapshot was deleted", left)
		}
	}

	// A crash after the take, then the source Sandbox force-deleted (its
	// node is down) and the SandboxSnapshot deleted: node-b removes the
	// finalizer (nothing names node-a), so node-a must find on its return
	// that the copy's object is gone. Last: it deletes the source.
	take := sandbox.CrashStep{Op: kube.OpSnapshotStore, Step: kube.SnapshotTake}
	if row := "store/" + take.String() + " then source and snapshot deleted"; only == "" || strings.Contains(row, only) {
		t.Run(row, func(t *testing.T) {
			arm(t, take.String())
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := "snap-crash-orphan"
			newSnapshot(ctx, t, c, name, source)
			select {
			case <-a.Exited():
			case <-time.After(waitLimit):
				t.Fatalf("node-a did not crash at %s in %s", take, waitLimit)
			}
			if ps := a.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
				t.Fatalf("node-a exited with %v, want SIGKILL at the crash point:\n%s", ps, a.LogTail(30))
			}
			if u, err := getSnapshot(ctx, c, name); err != nil || status(u, "snapshotID") != "" || status(u, "nodeName") != "" {
				t.Fatalf("after the crash at %s: %v, status %v; want nothing recorded", take, err, u.Object["status"])
			}
			if !slices.ContainsFunc(beforeA.Leaked(a.HostState(ctx)), func(s string) bool { return strings.HasPrefix(s, harness.KindFile+": snapshots/") }) {
				t.Fatalf("node-a crashed after %s with no snapshot in its data dir", take)
			}
			// What an operator does with a Sandbox of a dead node.
			src, err := getIn(ctx, c, ns, source)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, src); err != nil {
				t.Fatal(err)
			}
			waitFor(ctx, t, "the source's finalizers removed", func() (bool, string) {
				src, err := getIn(ctx, c, ns, source)
				if err != nil {
					return true, ""
				}
				src.SetFinalizers(nil)
				err = c.Update(ctx, src)
				return err == nil, fmt.Sprint(err)
			})
			waitGone(ctx, t, c, ns, source)
			deleteSnapshot(ctx, t, c, name, true)
			waitSnapshotGone(ctx, t, c, name) // node-b let it go
			a.Launch(t)
			if left := bucketKeys(ctx, t, raw, ns+"/"+name+"/"); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the delete", left)
			}
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}
}
