package kube

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// A claim carries no finalizer: its Sandbox is controlled by it (an owner
// reference), so the garbage collector deletes the Sandbox where one runs,
// and the claim controller deletes it where none does (a bare API server)
// when it sees the claim gone. A claim's create then costs no update, and
// its delete none either; the Sandbox's own finalizer still holds it until
// its agent killed the sandbox.

// claimOwnerIndex indexes Sandboxes by the name of the SandboxClaim that
// controls them.
const claimOwnerIndex = "agentbox.controller.sandboxclaim"

// claimOwnerOf is claimOwnerIndex's function.
func claimOwnerOf(o client.Object) []string {
	ref := metav1.GetControllerOfNoCopy(o)
	if ref == nil || ref.Kind != "SandboxClaim" || ref.APIVersion != extv1.GroupVersion().String() {
		return nil
	}
	return []string{ref.Name}
}

// releaseOrphans deletes the Sandboxes controlled by a claim named key
// that is not the claim of uid ("" = no claim of that name in the cache):
// a deleted claim's, or an earlier claim's of the same name. The API
// server has the last word before a delete, as the cache may not show a
// claim that a Sandbox it does show was made for.
func (r *claimReconciler) releaseOrphans(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	var list agentsv1.SandboxList
	if err := r.c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{claimOwnerIndex: key.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Sandboxes of claim %s: %w", key, err)
	}
	var orphans []*agentsv1.Sandbox
	for i := range list.Items {
		s := &list.Items[i]
		if owner := claimOwnerOf(s); len(owner) == 1 && owner[0] == key.Name &&
			metav1.GetControllerOfNoCopy(s).UID != uid && s.DeletionTimestamp.IsZero() {
			orphans = append(orphans, s)
		}
	}
	if len(orphans) == 0 {
		return nil
	}
	var claim extv1.SandboxClaim
	switch err := r.api.Get(ctx, key, &claim); {
	case apierrors.IsNotFound(err):
		uid = ""
	case err != nil:
		return fmt.Errorf("read claim %s: %w", key, err)
	default:
		uid = claim.UID
	}
	for _, s := range orphans {
		ref := metav1.GetControllerOfNoCopy(s)
		if ref.UID == uid {
			continue
		}
		del := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace}}
		if err := r.c.Delete(ctx, del, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete Sandbox %s of deleted claim %s: %w", s.Name, key, err)
		}
		r.log.Info("deleted the Sandbox of a deleted claim", "namespace", s.Namespace, "sandbox", s.Name, "claim", key.Name)
	}
	return nil
}

// preexisting remembers, per namespace, the claims the API server held when
// this controller first reconciled a claim there (it was leader by then) and
// the Sandbox each status named. Only the leader writes a claim's status, so
// a claim created later has none this process did not write (taken knows
// those), and its cached copy is read as the truth; one that existed before
// may hold a status from an earlier leader that the cache does not show yet.
// One list per namespace replaces a read of each claim.
type preexisting struct {
	mu     sync.Mutex
	listed map[string]bool
	held   map[types.UID]string
}

// sandbox is what the API server said claim held when its namespace was
// listed, and whether the claim existed then.
func (p *preexisting) sandbox(ctx context.Context, api client.Reader, claim *extv1.SandboxClaim) (string, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.listed[claim.Namespace] {
		var list extv1.SandboxClaimList
		if err := api.List(ctx, &list, client.InNamespace(claim.Namespace)); err != nil {
			return "", false, fmt.Errorf("list claims of namespace %s: %w", claim.Namespace, err)
		}
		if p.listed == nil {
			p.listed, p.held = map[string]bool{}, map[types.UID]string{}
		}
		p.listed[claim.Namespace] = true
		for _, c := range list.Items {
			p.held[c.UID] = c.Status.SandboxStatus.Name
		}
	}
	name, ok := p.held[claim.UID]
	return name, ok, nil
}

// forget drops a claim whose cached status is current.
func (p *preexisting) forget(claim types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, claim)
}
