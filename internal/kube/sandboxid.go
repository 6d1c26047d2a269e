package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
	for ns := range b.cfg.Teams {
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
// none), so the API tier's selector finds it.
func (b reconcilerBase) labelID(ctx context.Context, obj *agentsv1.Sandbox) error {
	id := obj.Status.SandboxID
	if obj.Labels[LabelSandboxID] == id {
		return nil
	}
	base := obj.DeepCopy()
	if id == "" {
		delete(obj.Labels, LabelSandboxID)
	} else {
		if obj.Labels == nil {
			obj.Labels = map[string]string{}
		}
		obj.Labels[LabelSandboxID] = id
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

// LabelledNamespaces maps the namespaces labelled LabelTeam to their team
// names: node agents bind them without a --kube-team flag each.
func LabelledNamespaces(ctx context.Context, kubeconfig string) (map[string]string, error) {
	rc, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	var list corev1.NamespaceList
	if err := c.List(ctx, &list, client.HasLabels{LabelTeam}); err != nil {
		return nil, fmt.Errorf("list namespaces labelled %s: %w", LabelTeam, err)
	}
	out := map[string]string{}
	for _, n := range list.Items {
		if t := n.Labels[LabelTeam]; t != "" && n.DeletionTimestamp.IsZero() {
			out[n.Name] = t
		}
	}
	return out, nil
}
