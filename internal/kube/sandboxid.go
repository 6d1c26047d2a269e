package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The E2B id of a Kubernetes sandbox. An API replica (serve --kubernetes)
// chooses it and puts it in AnnotationSandboxID of the Sandbox or
// SandboxClaim it creates; the node agent starts the sandbox under that id
// and labels every Sandbox it runs LabelSandboxID=<id>, so the API tier
// finds a sandbox by id with a label selector. A claim's id is carried to
// the Sandbox the claim cold-starts; a claim that adopts a warm member gets
// the member's id (the claim's status.sandbox.sandboxID says which).
const (
	AnnotationSandboxID = "agentbox.dev/sandbox-id"
	LabelSandboxID      = "agentbox.dev/sandbox-id"
	// LabelTeam on a namespace names the agentbox team owning it; on an
	// API key Secret, the team of the key.
	LabelTeam = "agentbox.dev/team"
)

// chosenID returns the id an API replica chose for obj ("" = none).
func chosenID(obj client.Object) (string, error) {
	id := obj.GetAnnotations()[AnnotationSandboxID]
	if id == "" {
		return "", nil
	}
	if !sandbox.ValidID(id) {
		return "", fmt.Errorf("metadata.annotations[%s] %q: want 2-64 characters of a-z and 0-9: %w", AnnotationSandboxID, id, errdefs.ErrInvalidArgument)
	}
	return id, nil
}

// idTaken reports whether another Sandbox of a bound namespace already
// carries id. (The API tier also treats an id carried twice as unknown, so
// a tenant that copies another's id never reaches that sandbox.)
func (b reconcilerBase) idTaken(ctx context.Context, obj *agentsv1.Sandbox, id string) (bool, error) {
	for _, ns := range b.teams.namespaces() {
		var list agentsv1.SandboxList
		if err := b.api.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{LabelSandboxID: id}); err != nil {
			return false, fmt.Errorf("list Sandboxes labelled %s=%s: %w", LabelSandboxID, id, err)
		}
		for _, o := range list.Items {
			if o.UID != obj.UID {
				return true, nil
			}
		}
	}
	return false, nil
}

// labelID labels obj with its sandbox id (removing the label once it has
// none), so the API tier's selector finds it, and once it runs in a
// label-bound namespace with the name of its team (LabelTeam), which keeps
// it with that team when its namespace is re-labelled (bindings.go). The
// agent's team overwrites whatever team label the object's writer set.
func (b reconcilerBase) labelID(ctx context.Context, obj *agentsv1.Sandbox, team string) error {
	id := obj.Status.SandboxID
	wantTeam := obj.Labels[LabelTeam]
	if id != "" && team != "" {
		wantTeam = team
	}
	if obj.Labels[LabelSandboxID] == id && obj.Labels[LabelTeam] == wantTeam {
		return nil
	}
	base := obj.DeepCopy()
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	if id == "" {
		delete(obj.Labels, LabelSandboxID)
	} else {
		obj.Labels[LabelSandboxID] = id
	}
	if wantTeam != "" {
		obj.Labels[LabelTeam] = wantTeam
	}
	return client.IgnoreNotFound(b.c.Patch(ctx, obj, client.MergeFrom(base)))
}

// checkID refuses a chosen id another Sandbox carries.
func (b reconcilerBase) checkID(ctx context.Context, obj *agentsv1.Sandbox, id string) error {
	taken, err := b.idTaken(ctx, obj, id)
	if err != nil {
		return err
	}
	if taken {
		return fmt.Errorf("metadata.annotations[%s] %q: another Sandbox already has this sandbox id; remove the annotation or choose another id: %w", AnnotationSandboxID, id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CanWatchNamespaces checks that the agent may list and watch Namespaces,
// which binding labelled namespaces live needs (a Forbidden error when it
// may not).
func CanWatchNamespaces(ctx context.Context, kubeconfig string) error {
	rc, err := RESTConfig(kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(rc, client.Options{})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	var list corev1.NamespaceList
	if err := c.List(ctx, &list, client.Limit(1)); err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	secs := int64(1)
	w, err := c.Watch(ctx, &list, &client.ListOptions{Raw: &metav1.ListOptions{TimeoutSeconds: &secs}})
	if err != nil {
		return fmt.Errorf("watch namespaces: %w", err)
	}
	w.Stop()
	return nil
}
