package kube

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// TestKubeLeaderStandsAgain: a controller that loses the leader election
// (here another holder takes its Lease, as when an API server too loaded
// to answer lets the renewal run out) stands again and, once leader,
// reconciles pools as before, instead of stopping for good.
func TestKubeLeaderStandsAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, kcPath := cluster(ctx, t)
	c := fastClient(t, kcPath)
	s := harness.Start(t, harness.Name(t.Name()), harness.Args("--kube-controller", "--kubeconfig", kcPath,
		"--kube-team", ns+"=default", "--kube-leader-elect", "--kube-leader-elect-namespace", "default",
		"--kube-lease-namespace", "default"))
	t.Cleanup(func() { drain(t, c) })

	key := client.ObjectKey{Namespace: "default", Name: "agentbox-controller." + agentsv1.Group}
	var holder string
	waitFor(ctx, t, "the controller to lead", func() (bool, string) {
		var l coordv1.Lease
		if err := c.Get(ctx, key, &l); err != nil {
			return false, err.Error()
		}
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		return holder != "", "no holder"
	})

	// Another holder takes the Lease for 15 s and never renews it.
	waitFor(ctx, t, "the Lease taken by another holder", func() (bool, string) {
		var l coordv1.Lease
		if err := c.Get(ctx, key, &l); err != nil {
			return false, err.Error()
		}
		now := metav1.NewMicroTime(time.Now())
		secs := int32(15)
		l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.AcquireTime, l.Spec.LeaseDurationSeconds = new("intruder"), &now, &now, &secs
		if err := c.Update(ctx, &l); err != nil {
			return false, err.Error() // a renewal came in between
		}
		return true, ""
	})
	waitFor(ctx, t, "the controller to lose the election", func() (bool, string) {
		b, err := os.ReadFile(s.LogPath)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(b), "leader election lost"), "no log line saying it lost the election"
	})

	// Once the taken Lease ran out, a pool made now is reconciled.
	tpl := &extv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "tpl-leader", Namespace: ns}}
	tpl.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "agent", Image: "base"}}
	pool := &extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: "pool-leader", Namespace: ns}}
	pool.Spec.TemplateRef.Name = tpl.Name
	pool.Spec.Replicas = new(int32(2))
	for _, o := range []client.Object{tpl, pool} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
	waitFor(ctx, t, "the pool's members, made by the controller leading again", func() (bool, string) {
		var list agentsv1.SandboxList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{agentsv1.LabelWarmPool: pool.Name}); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 2, fmt.Sprintf("%d members", len(list.Items))
	})
	var l coordv1.Lease
	if err := c.Get(ctx, key, &l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "intruder" {
		t.Errorf("Lease holder %v after the controller stood again, want the controller", l.Spec.HolderIdentity)
	}
}
