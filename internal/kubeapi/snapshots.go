package kubeapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
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

func snapshotInfo(snap *abv1.SandboxSnapshot) rest.SnapshotInfo {
	names := []string{snapshotRef(snap)}
	if snap.Spec.Name != "" {
		names = append(names, snap.Name+":default")
	}
	return rest.SnapshotInfo{SnapshotID: snapshotRef(snap), Names: names}
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
func (s *Server) teamSnapshots(ctx context.Context) ([]*abv1.SandboxSnapshot, error) {
	var out []*abv1.SandboxSnapshot
	who := callerOf(ctx)
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
func (s *Server) snapshotOf(ctx context.Context, ref string) (*abv1.SandboxSnapshot, error) {
	key := snapshotKey(ref)
	if key == "" {
		return nil, nil
	}
	all, err := s.teamSnapshots(ctx)
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

// createSnapshot serves POST /sandboxes/{id}/snapshots: a SandboxSnapshot
// of the caller's Sandbox, answered once its node agent took it.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var body rest.SnapshotRequest
	if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	if body.Memory != nil && !*body.Memory {
		httperr.Write(w, invalid("memory: filesystem-only snapshots are not served by `agentbox serve --kubernetes`; leave memory out"))
		return
	}
	name := ""
	if body.Name != nil {
		name = *body.Name
		if name == "" || len(name) > 128 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			httperr.Write(w, invalid("name: use 1-128 lowercase letters, digits, '-' and '_'"))
			return
		}
	}
	sb, err := s.lookup(ctx, r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if paused(sb) {
		httperr.Write(w, fmt.Errorf("sandbox %q is paused; snapshots are taken of running sandboxes (resume it first): %w", sb.Status.SandboxID, errdefs.ErrConflict))
		return
	}
	if name != "" {
		// E2B gives the name to the new snapshot; ours are immutable, so
		// the one holding it goes.
		old, err := s.snapshotOf(ctx, name)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		if old != nil && old.Spec.Name == name {
			if err := s.c.Delete(ctx, old); client.IgnoreNotFound(err) != nil {
				httperr.Write(w, fmt.Errorf("replace snapshot %s: %w", name, kubeErr(err)))
				return
			}
		}
	}
	snap := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{
		Name: "snap" + sandbox.NewID(), Namespace: sb.Namespace, Labels: map[string]string{LabelOrigin: "e2b-api"},
	}}
	snap.Spec.SandboxRef.Name, snap.Spec.Name = sb.Name, name
	if err := s.c.Create(ctx, snap); err != nil {
		httperr.Write(w, fmt.Errorf("create SandboxSnapshot %s/%s: %w", snap.Namespace, snap.Name, kubeErr(err)))
		return
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
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, snapshotInfo(&got))
}

// listSnapshots serves GET /snapshots (sandboxID, name, limit, nextToken):
// the caller's Ready snapshots, newest first, limit a page with the next
// page's token in X-Next-Token.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := apireq.SnapshotLimit(q)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	all, err := s.teamSnapshots(r.Context())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	sid, name := q.Get("sandboxID"), snapshotKey(q.Get("name"))
	all = slices.DeleteFunc(all, func(sn *abv1.SandboxSnapshot) bool {
		return sn.Status.Phase != abv1.PhaseReady || (sid != "" && sn.Status.SandboxID != sid) ||
			(name != "" && sn.Name != name && sn.Spec.Name != name)
	})
	page, next := apireq.Page(all, func(sn *abv1.SandboxSnapshot) string { return sn.Name }, q.Get("nextToken"), limit)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	out := make([]rest.SnapshotInfo, 0, len(page))
	for _, sn := range page {
		out = append(out, snapshotInfo(sn))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// deleteTemplate serves DELETE /templates/{id}: the SDK's deleteSnapshot.
// Templates are not served, so anything but the caller's snapshot is 404.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshotOf(r.Context(), r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if snap == nil {
		httperr.Write(w, fmt.Errorf("snapshot %q not found (templates are not served by `agentbox serve --kubernetes`): %w", apireq.Truncate(r.PathValue("id")), errdefs.ErrNotFound))
		return
	}
	if err := s.c.Delete(r.Context(), snap); client.IgnoreNotFound(err) != nil {
		httperr.Write(w, fmt.Errorf("delete SandboxSnapshot %s/%s: %w", snap.Namespace, snap.Name, kubeErr(err)))
		return
	}
	// Answer once this replica's cache sees it go (its finalizer may hold
	// it a while), so a list right after does not show it.
	_ = s.poll(r.Context(), "delete", func() (bool, error) {
		var got abv1.SandboxSnapshot
		err := s.c.Get(r.Context(), client.ObjectKeyFromObject(snap), &got)
		return apierrors.IsNotFound(err) || (err == nil && !got.DeletionTimestamp.IsZero()), nil
	})
	w.WriteHeader(http.StatusNoContent)
}

// fromSnapshot is the Sandbox a create with templateID = one of the
// caller's snapshots makes: in the snapshot's namespace, annotated with it,
// its image the snapshot's template (the agent restores memory and files).
func fromSnapshot(snap *abv1.SandboxSnapshot, om metav1.ObjectMeta, body rest.NewSandbox, end metav1.Time) *agentsv1.Sandbox {
	om.Namespace = snap.Namespace
	om.Annotations[kube.AnnotationSnapshot] = snap.Name
	obj := &agentsv1.Sandbox{ObjectMeta: om}
	c := corev1.Container{Name: "sandbox", Image: snap.Status.Template}
	for _, k := range sortedKeys(body.EnvVars) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: body.EnvVars[k]})
	}
	obj.Spec.PodTemplate.Spec.Containers = []corev1.Container{c}
	obj.Spec.ShutdownTime = &end
	del := agentsv1.ShutdownPolicyDelete
	obj.Spec.ShutdownPolicy = &del
	return obj
}
