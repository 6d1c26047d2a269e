package kubeapi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/kube"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// A snapshot through serve --kubernetes is a SandboxSnapshot in the
// namespace of its Sandbox, named snap<id>; its E2B id is "<name>:default"
// with name its spec.name, else the object's name.

func snapshotRef(snap *abv1.SandboxSnapshot) string {
	if snap.Spec.Name != "" {
		return snap.Spec.Name + ":default"
	}
	return snap.Name + ":default"
}

// snapshotOfObject is the record the API reports of snap: its id the
// object's name, its name spec.name (SnapshotRef gives snapshotRef).
func snapshotOfObject(snap *abv1.SandboxSnapshot) *sandbox.Snapshot {
	return &sandbox.Snapshot{ID: snap.Name, Name: snap.Spec.Name, SandboxID: snap.Status.SandboxID, CreatedAt: snap.CreationTimestamp.UTC()}
}

// snapshotKey is the object name or spec.name a reference names, without
// E2B's "namespace/" and ":tag".
func snapshotKey(ref string) string {
	ref, _, _ = strings.Cut(ref, ":")
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		ref = ref[i+1:]
	}
	return ref
}

// teamSnapshots lists the caller's SandboxSnapshots (in its namespaces,
// taken by its team, not being deleted), newest first.
func (s *Server) teamSnapshots(ctx context.Context, who caller) ([]*abv1.SandboxSnapshot, error) {
	var out []*abv1.SandboxSnapshot
	for _, ns := range who.namespaces {
		var list abv1.SandboxSnapshotList
		if err := s.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("list SandboxSnapshots: %w", err)
		}
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp.IsZero() && snapshotOwnedBy(&list.Items[i], who.team) {
				out = append(out, &list.Items[i])
			}
		}
	}
	slices.SortFunc(out, func(a, b *abv1.SandboxSnapshot) int {
		if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// snapshotOf finds the caller's snapshot ref (by object name or spec.name);
// another team's is as unknown as a missing one (nil).
func (s *Server) snapshotOf(ctx context.Context, who caller, ref string) (*abv1.SandboxSnapshot, error) {
	key := snapshotKey(ref)
	if key == "" {
		return nil, nil
	}
	all, err := s.teamSnapshots(ctx, who)
	if err != nil {
		return nil, err
	}
	for _, snap := range all {
		if snap.Name == key {
			return snap, nil
		}
	}
	for _, snap := range all {
		if snap.Spec.Name == key {
			return snap, nil
		}
	}
	return nil, nil
}

// CreateSnapshot makes a SandboxSnapshot of the team's Sandbox and waits
// until its node agent took it.
func (s *Server) CreateSnapshot(ctx context.Context, team, id, name string, memory bool) (*sandbox.Snapshot, error) {
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return nil, err
	}
	if !memory {
		return nil, errFilesOnly
	}
	if paused(sb) {
		return nil, fmt.Errorf("sandbox %q is paused; snapshots are taken of running sandboxes (resume it first): %w", sb.Status.SandboxID, errdefs.ErrConflict)
	}
	snap := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{
		Name: "snap" + sandbox.NewID(), Namespace: sb.Namespace, Labels: map[string]string{LabelOrigin: "e2b-api"},
	}}
	snap.Spec.SandboxRef.Name, snap.Spec.Name = sb.Name, name
	if err := s.c.Create(ctx, snap); err != nil {
		return nil, fmt.Errorf("create SandboxSnapshot %s/%s: %w", snap.Namespace, snap.Name, kubeErr(err))
	}
	var got abv1.SandboxSnapshot
	err = s.poll(ctx, "snapshot sandbox "+sb.Status.SandboxID, func() (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(snap), &got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if got.Status.Phase == abv1.PhaseFailed {
			msg := "failed"
			if c := meta.FindStatusCondition(got.Status.Conditions, abv1.ConditionReady); c != nil {
				msg = c.Reason + ": " + c.Message
			}
			return false, fmt.Errorf("snapshot of sandbox %s: %s: %w", sb.Status.SandboxID, msg, errdefs.ErrConflict)
		}
		return got.Status.Phase == abv1.PhaseReady, nil
	})
	if err != nil {
		s.cleanup(snap)
		return nil, err
	}
	return snapshotOfObject(&got), nil
}

// ListSnapshots is the team's Ready snapshots, newest first.
func (s *Server) ListSnapshots(ctx context.Context, team, sandboxID, name string) ([]*sandbox.Snapshot, error) {
	who, err := s.teamNamespaces(ctx, team)
	if err != nil {
		return nil, err
	}
	all, err := s.teamSnapshots(ctx, who)
	if err != nil {
		return nil, err
	}
	name = snapshotKey(name)
	out := []*sandbox.Snapshot{}
	for _, sn := range all {
		if sn.Status.Phase != abv1.PhaseReady || (sandboxID != "" && sn.Status.SandboxID != sandboxID) ||
			(name != "" && sn.Name != name && sn.Spec.Name != name) {
			continue
		}
		out = append(out, snapshotOfObject(sn))
	}
	return out, nil
}

// DeleteSnapshot deletes the team's snapshot ref (by object name or
// spec.name) and answers once this replica's cache sees it go.
func (s *Server) DeleteSnapshot(ctx context.Context, team, ref string) (bool, error) {
	who, err := s.teamNamespaces(ctx, team)
	if err != nil {
		return false, err
	}
	snap, err := s.snapshotOf(ctx, who, ref)
	if err != nil || snap == nil {
		return false, err
	}
	if err := s.c.Delete(ctx, snap); client.IgnoreNotFound(err) != nil {
		return true, fmt.Errorf("delete SandboxSnapshot %s/%s: %w", snap.Namespace, snap.Name, kubeErr(err))
	}
	s.awaitGone(ctx, snap, &abv1.SandboxSnapshot{})
	return true, nil
}

// fromSnapshot is the Sandbox a create with templateID = one of the
// caller's snapshots makes: in the snapshot's namespace, annotated with it,
// its image the snapshot's template (the agent restores memory and files).
func fromSnapshot(snap *abv1.SandboxSnapshot, om metav1.ObjectMeta, env map[string]string, end metav1.Time) *agentsv1.Sandbox {
	om.Namespace = snap.Namespace
	om.Annotations[kube.AnnotationSnapshot] = snap.Name
	obj := &agentsv1.Sandbox{ObjectMeta: om}
	c := corev1.Container{Name: "sandbox", Image: snap.Status.Template}
	for _, k := range sortedKeys(env) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: env[k]})
	}
	obj.Spec.PodTemplate.Spec.Containers = []corev1.Container{c}
	obj.Spec.ShutdownTime = &end
	del := agentsv1.ShutdownPolicyDelete
	obj.Spec.ShutdownPolicy = &del
	return obj
}
