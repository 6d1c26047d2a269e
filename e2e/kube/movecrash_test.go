package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/minio/minio-go/v7"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/sandbox"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// moveRig is two node agents sharing a bucket, both launched with the
// row's crash point: whichever reaches it dies there, and revive starts it
// again without.
type moveRig struct {
	ctx  context.Context
	t    *testing.T
	a, b *harness.Server
	// down are the agents the test stopped itself (node-a, to lose it).
	down map[*harness.Server]bool
	// crashes lists the agents the crash point killed.
	crashes []string
}

// revive relaunches an agent the crash point killed (SIGKILL of itself),
// without the crash flag.
func (m *moveRig) revive() {
	m.t.Helper()
	for _, s := range []*harness.Server{m.a, m.b} {
		if m.down[s] {
			continue
		}
		select {
		case <-s.Exited():
		default:
			continue
		}
		if ps := s.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
			m.t.Fatalf("agent %s exited with %v, want SIGKILL at the crash point:\n%s", s.Instance, ps, s.LogTail(30))
		}
		m.crashes = append(m.crashes, s.Instance)
		s.Launch(m.t)
	}
}

func crashKilled(sys any) bool {
	ws, ok := sys.(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// wait is waitFor that revives a crashed agent on every poll.
func (m *moveRig) wait(what string, f func() (bool, string)) {
	m.t.Helper()
	waitFor(m.ctx, m.t, what, func() (bool, string) {
		m.revive()
		return f()
	})
}

// TestKubeMoveCrash crashes a node agent after every named step of a move
// (kube.MoveCrashSteps: the old node storing the image, the live agent
// rebinding the Sandbox, the new node restoring it), starts it again, and
// finishes the move. Each row checks that the sandbox is whole on exactly
// one node under its own id (a command runs; its file, its process and the
// counter in that process's memory are intact), that the Sandbox's status
// says it was restored, and that neither node nor the bucket holds anything
// once the Sandbox is deleted. Rows after the table crash after the upload
// and then delete or resume the Sandbox while its node is down (the bucket
// must end empty), and crash right after marking a running Sandbox's node
// lost. $CRASH_POINT narrows the table to the rows containing it.
func TestKubeMoveCrash(t *testing.T) {
	harness.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	c, raw, agent := bucketAgents(ctx, t)
	// node-a has more room: every row's Sandbox starts there.
	a := agent("node-a", "--kube-node-cpu", "16", "--kube-node-memory-mb", "32768")
	b := agent("node-b", "--kube-node-cpu", "4", "--kube-node-memory-mb", "4096")
	t.Cleanup(func() { drain(t, c) })
	sdkOf := func(s *harness.Server) *agentbox.Client {
		return agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	}
	only := os.Getenv("CRASH_POINT")
	for i, point := range kube.MoveCrashSteps() {
		if only != "" && !strings.Contains(point.String(), only) {
			continue
		}
		t.Run(point.String(), func(t *testing.T) {
			m := &moveRig{ctx: ctx, t: t, a: a, b: b, down: map[*harness.Server]bool{}}
			for _, s := range []*harness.Server{a, b} {
				select {
				case <-s.Exited():
				default:
					s.Terminate(t)
				}
				s.Launch(t, "--test-crash-after", point.String())
			}
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := fmt.Sprintf("move-crash-%d", i)
			u := decode(t, direct)[0]
			u.SetName(name)
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			id := waitReady(ctx, t, c, name)
			if got, _ := getIn(ctx, c, ns, name); status(got, "nodeName") != "node-a" {
				t.Fatalf("%s is on %q, want node-a", name, status(got, "nodeName"))
			}
			// The leak check must see a live sandbox, else it proves nothing.
			if seen := beforeA.Leaked(a.HostState(ctx)); !slices.ContainsFunc(seen, func(s string) bool { return strings.HasPrefix(s, harness.KindContainer+": ") }) {
				t.Fatalf("node-a's host state does not show sandbox %s (new: %v)", id, seen)
			}
			sbx, err := sdkOf(a).Connect(ctx, id, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			// A counter that lives only in a shell's memory, and a file.
			res, err := sbx.Commands.Run(ctx, `sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &
echo $! > /tmp/counter.pid; echo 'written on node-a' > /tmp/moved.txt; sleep 0.5; cat /tmp/counter.pid; cat /tmp/count`)
			if err != nil {
				t.Fatal(err)
			}
			first := strings.Fields(res.Stdout)
			if len(first) != 2 {
				t.Fatalf("counter pid and count: %q", res.Stdout)
			}
			pid := first[0]
			countBefore, _ := strconv.Atoi(first[1])

			mode(ctx, t, c, name, "Suspended")
			// Stored by node-a; or node-a died after recording it and
			// was lost long enough that node-b took the Sandbox over.
			m.wait(name+" image stored", func() (bool, string) {
				u, err := getIn(ctx, c, ns, name)
				if err != nil {
					return false, err.Error()
				}
				_, has := storedImageOf(u)
				cond := condition(u, kube.ConditionImageStored)
				return has && (status(u, "nodeName") == "node-b" || cond != nil && cond.Status == metav1.ConditionTrue), fmtCond(cond) + " on " + status(u, "nodeName")
			})
			if u, _ := getIn(ctx, c, ns, name); status(u, "nodeName") == "node-a" {
				a.Kill9(t)
				m.down[a] = true
				m.wait(name+" moved to node-b", func() (bool, string) {
					u, err := getIn(ctx, c, ns, name)
					if err != nil {
						return false, err.Error()
					}
					return status(u, "nodeName") == "node-b", fmtCond(condition(u, "Ready")) + " on " + status(u, "nodeName")
				})
			}
			mode(ctx, t, c, name, "Running")
			m.wait(name+" Ready on node-b", func() (bool, string) {
				u, err := getIn(ctx, c, ns, name)
				if err != nil {
					return false, err.Error()
				}
				rc := condition(u, "Ready")
				return rc != nil && rc.Status == metav1.ConditionTrue && status(u, "nodeName") == "node-b" && status(u, "sandboxID") == id,
					fmtCond(rc) + " on " + status(u, "nodeName") + " as " + status(u, "sandboxID")
			})
			// Whole on node-b, under its own id, with its memory.
			sbx, err = sdkOf(b).Connect(ctx, id, 10*time.Minute)
			if err != nil {
				t.Fatalf("connect on node-b: %v", err)
			}
			res, err = sbx.Commands.Run(ctx, `cat /tmp/counter.pid; kill -0 $(cat /tmp/counter.pid) && echo alive; cat /tmp/moved.txt; cat /tmp/count; sleep 0.5; cat /tmp/count`)
			if err != nil {
				t.Fatalf("command on node-b: %v", err)
			}
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			if len(lines) != 5 || lines[0] != pid || lines[1] != "alive" || lines[2] != "written on node-a" {
				t.Fatalf("on node-b: %q; want the counter %s alive and the file", res.Stdout, pid)
			}
			c1, _ := strconv.Atoi(lines[3])
			c2, _ := strconv.Atoi(lines[4])
			if c1 < countBefore || c2 <= c1 {
				t.Errorf("counter %d at the suspension, %d then %d on node-b: want it to go on from its memory", countBefore, c1, c2)
			}
			// The status says what happened.
			u, _ = getIn(ctx, c, ns, name)
			if cond := condition(u, kube.ConditionImageStored); cond == nil || cond.Reason != kube.ReasonImageRestored || !strings.Contains(cond.Message, "node-b") {
				t.Errorf("ImageStored after the move: %s; want %s on node-b", fmtCond(cond), kube.ReasonImageRestored)
			}
			if _, has := storedImageOf(u); has {
				t.Errorf("the Sandbox still records a stored image after the restore: %v", u.GetAnnotations())
			}
			if left := bucketKeys(ctx, t, raw, ns+"/"); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the restore", left)
			}
			// Exactly one node: node-a, back, removes its copy.
			if m.down[a] {
				a.Launch(t)
				m.down[a] = false
			}
			m.wait("node-a's copy to go", func() (bool, string) {
				left := append(sandboxesOf(ctx, t, a), leftovers(a, id)...)
				return len(left) == 0, strings.Join(left, ", ")
			})
			if ids := sandboxesOf(ctx, t, b); len(ids) != 1 || ids[0] != id {
				t.Errorf("node-b runs %v, want %s", ids, id)
			}
			if len(m.crashes) != 1 {
				t.Fatalf("agents killed at %s: %v; want exactly one crash there", point, m.crashes)
			}
			t.Logf("crashed %s at %s; the move finished", m.crashes[0], point)

			if err := c.Delete(ctx, u); err != nil {
				t.Fatal(err)
			}
			m.wait(name+" deleted", func() (bool, string) {
				_, err := getIn(ctx, c, ns, name)
				return err != nil, fmt.Sprint(err)
			})
			if left := bucketKeys(ctx, t, raw, ""); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the delete", left)
			}
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}

	// A crash right after the upload, then the Sandbox deleted or resumed
	// before its node returns: nothing records that image, so whoever
	// deletes or resumes the Sandbox must find it in the bucket.
	upload := sandbox.CrashStep{Op: sandbox.OpMoveOut, Step: kube.MoveUpload}
	for _, then := range []string{"delete", "resume"} {
		row := upload.String() + " then " + then
		if only != "" && !strings.Contains(row, only) {
			continue
		}
		t.Run(row, func(t *testing.T) {
			for _, s := range []*harness.Server{a, b} {
				select {
				case <-s.Exited():
				default:
					s.Terminate(t)
				}
				s.Launch(t, "--test-crash-after", upload.String())
			}
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := "move-crash-then-" + then
			u := decode(t, direct)[0]
			u.SetName(name)
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			id := waitReady(ctx, t, c, name)
			if got, _ := getIn(ctx, c, ns, name); status(got, "nodeName") != "node-a" {
				t.Fatalf("%s is on %q, want node-a", name, status(got, "nodeName"))
			}
			mode(ctx, t, c, name, "Suspended")
			select {
			case <-a.Exited():
			case <-time.After(waitLimit):
				t.Fatalf("node-a did not crash at %s in %s", upload, waitLimit)
			}
			if ps := a.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
				t.Fatalf("node-a exited with %v, want SIGKILL at the crash point:\n%s", ps, a.LogTail(30))
			}
			// Else the row would prove nothing.
			if keys := bucketKeys(ctx, t, raw, ns+"/"+id+"/"); len(keys) == 0 {
				t.Fatalf("node-a crashed after %s with nothing in the bucket under %s/%s/", upload, ns, id)
			}
			u, err := getIn(ctx, c, ns, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, has := storedImageOf(u); has {
				t.Fatalf("the image is recorded although node-a crashed before the record step: %v", u.GetAnnotations())
			}
			switch then {
			case "delete":
				if err := c.Delete(ctx, u); err != nil {
					t.Fatal(err)
				}
			case "resume":
				mode(ctx, t, c, name, "Running")
			}
			a.Launch(t)
			switch then {
			case "delete":
				waitGone(ctx, t, c, ns, name)
			case "resume":
				// The crash lost the suspension's status: Ready=True is the
				// one from before it until node-a has seen the Running spec.
				waitFor(ctx, t, name+" Ready on node-a", func() (bool, string) {
					u, err := getIn(ctx, c, ns, name)
					if err != nil {
						return false, err.Error()
					}
					rc := condition(u, "Ready")
					seen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
					return rc != nil && rc.Status == metav1.ConditionTrue && seen == u.GetGeneration() && status(u, "nodeName") == "node-a" && status(u, "sandboxID") == id,
						fmt.Sprintf("%s on %s, generation %d seen %d", fmtCond(rc), status(u, "nodeName"), u.GetGeneration(), seen)
				})
				sbx, err := sdkOf(a).Connect(ctx, id, 10*time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if res, err := sbx.Commands.Run(ctx, "echo resumed"); err != nil || strings.TrimSpace(res.Stdout) != "resumed" {
					t.Fatalf("command after the resume: %v %+v", err, res)
				}
			}
			if left := bucketKeys(ctx, t, raw, ns+"/"); len(left) != 0 {
				t.Errorf("the bucket keeps %v after the %s", left, then)
			}
			if then == "resume" {
				deleteAndWait(ctx, t, c, ns, name)
			}
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}

	// A crash right after marking a running Sandbox's node lost (no image
	// stored, so nothing moves): the mark stays, and the node, back, makes
	// the Sandbox Ready again with its files.
	mark := kube.OpNodeLost + "/" + kube.NodeLostMark
	if row := mark + " running"; only == "" || strings.Contains(row, only) {
		t.Run(row, func(t *testing.T) {
			for _, s := range []*harness.Server{a, b} {
				select {
				case <-s.Exited():
				default:
					s.Terminate(t)
				}
				s.Launch(t, "--test-crash-after", mark)
			}
			beforeA, beforeB := a.HostState(ctx), b.HostState(ctx)
			name := "move-crash-lost-running"
			u := decode(t, direct)[0]
			u.SetName(name)
			if err := c.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			id := waitReady(ctx, t, c, name)
			if got, _ := getIn(ctx, c, ns, name); status(got, "nodeName") != "node-a" {
				t.Fatalf("%s is on %q, want node-a", name, status(got, "nodeName"))
			}
			sbx, err := sdkOf(a).Connect(ctx, id, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sbx.Commands.Run(ctx, "echo 'kept through the loss' > /tmp/lost.txt"); err != nil {
				t.Fatal(err)
			}
			a.Kill9(t)
			select {
			case <-b.Exited():
			case <-time.After(waitLimit):
				t.Fatalf("node-b did not crash at %s in %s", mark, waitLimit)
			}
			if ps := b.ProcessState(); ps == nil || !crashKilled(ps.Sys()) {
				t.Fatalf("node-b exited with %v, want SIGKILL at the crash point:\n%s", ps, b.LogTail(30))
			}
			u, err = getIn(ctx, c, ns, name)
			if err != nil {
				t.Fatal(err)
			}
			if rc := condition(u, "Ready"); rc == nil || rc.Reason != kube.ReasonNodeLost || status(u, "nodeName") != "node-a" {
				t.Fatalf("after the crash at %s: Ready %s on %s; want %s, still bound to node-a", mark, fmtCond(rc), status(u, "nodeName"), kube.ReasonNodeLost)
			}
			b.Launch(t)
			a.Launch(t)
			waitFor(ctx, t, name+" Ready on node-a again", func() (bool, string) {
				u, err := getIn(ctx, c, ns, name)
				if err != nil {
					return false, err.Error()
				}
				rc := condition(u, "Ready")
				return rc != nil && rc.Status == metav1.ConditionTrue && status(u, "nodeName") == "node-a" && status(u, "sandboxID") == id,
					fmtCond(rc) + " on " + status(u, "nodeName")
			})
			sbx, err = sdkOf(a).Connect(ctx, id, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if res, err := sbx.Commands.Run(ctx, "cat /tmp/lost.txt"); err != nil || strings.TrimSpace(res.Stdout) != "kept through the loss" {
				t.Fatalf("after node-a's return: %v %+v", err, res)
			}
			deleteAndWait(ctx, t, c, ns, name)
			a.WaitNoLeaks(t, beforeA)
			b.WaitNoLeaks(t, beforeB)
		})
	}
}

// waitGone waits until Sandbox ns/name no longer exists.
func waitGone(ctx context.Context, t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	waitFor(ctx, t, name+" deleted", func() (bool, string) {
		_, err := getIn(ctx, c, ns, name)
		return err != nil, fmt.Sprint(err)
	})
}

// deleteAndWait deletes Sandbox ns/name and waits until it is gone.
func deleteAndWait(ctx context.Context, t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	u, _ := getIn(ctx, c, ns, name)
	if err := c.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, ns, name)
}

// bucketAgents starts a cluster with a bucket and returns a function that
// starts a node agent moving images through it (the crash tables' set-up).
func bucketAgents(ctx context.Context, t *testing.T) (client.Client, *minio.Client, func(node string, extra ...string) *harness.Server) {
	c, kcPath := cluster(ctx, t)
	createTeamNamespace(ctx, t, c, "agentbox-system", nil)
	url, raw := s3Server(t)
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile, credFile, secret := filepath.Join(dir, "image.key"), filepath.Join(dir, "s3.env"), filepath.Join(dir, "token-secret")
	for f, body := range map[string]string{
		secret:   strings.Repeat("0123456789abcdef", 4),
		keyFile:  hex.EncodeToString(key),
		credFile: "AWS_ACCESS_KEY_ID=test-access\nAWS_SECRET_ACCESS_KEY=test-secret\n",
	} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c, raw, func(node string, extra ...string) *harness.Server {
		return harness.Start(t, harness.Name(t.Name()+"-"+node), harness.Args(append([]string{"--kube-controller", "--kubeconfig", kcPath,
			"--kube-node", node, "--kube-team", ns + "=default",
			"--kube-leader-elect", "--kube-leader-elect-namespace", "default",
			"--kube-lease-namespace", "agentbox-system", "--kube-lease-duration", "3s", "--token-secret-file", secret,
			"--kube-object-store", url, "--kube-object-store-key-file", keyFile, "--kube-object-store-credentials-file", credFile}, extra...)...))
	}
}
