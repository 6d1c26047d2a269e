package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/kubeapi"
	"github.com/agentbox/agentbox/internal/kubeevents"
	"github.com/agentbox/agentbox/internal/store"
)

// kubeClient is an uncached client of the cluster.
func kubeClient(kubeconfig string) (client.Client, error) {
	rc, err := kube.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme, err := kube.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// startKubeAPIEvents serves lifecycle events and webhooks on the API tier:
// events read from the node agents, webhooks kept as Secrets in the
// webhooks namespace (internal/kubeevents). The node agents derive and deliver.
func startKubeAPIEvents(ctx context.Context, c serveConfig, srv *kubeapi.Server, secret []byte, log *slog.Logger) error {
	if err := checkWebhooksNamespace(c.KubeAPI); err != nil {
		return err
	}
	kc, err := kubeClient(c.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	// Registrations are checked against the same policy the agents deliver
	// through (given the same --fetch-allow and --fetch-deny).
	subnet, _ := netip.ParsePrefix(c.Subnet)
	policy, err := c.Fetch.policy(subnet)
	if err != nil {
		return err
	}
	st := kubeevents.NewStore(kc, c.KubeAPI.WebhooksNS, c.Kube.LeaseNS, secret, log.With("component", "events"))
	svc, err := events.New(ctx, events.Config{MaxAge: c.Events.MaxAge, MaxWebhooks: c.Events.MaxWebhooks}, st, nil, nil, policy, log)
	if err != nil {
		return err
	}
	srv.SetEvents(svc) // the service is not run: nothing is derived here
	return nil
}

// clusterFeed serves the events feed the API tier reads on a node agent
// (--kube-controller with --token-secret-file) in front of next.
func clusterFeed(c serveConfig, secret []byte, st *store.Store, next http.Handler, log *slog.Logger) http.Handler {
	if !c.Kube.Controller {
		return next
	}
	return kubeevents.Feed(next, secret, st, log.With("component", "events-feed"))
}

// startWebhookMirror copies the cluster's webhook Secrets into a node
// agent's store, so its events service delivers to them.
func startWebhookMirror(ctx context.Context, c serveConfig, st *store.Store, log *slog.Logger) error {
	if !c.Kube.Controller {
		return nil
	}
	if err := checkWebhooksNamespace(c.KubeAPI); err != nil {
		return err
	}
	kc, err := kubeClient(c.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	ns := c.KubeAPI.WebhooksNS
	log = log.With("component", "webhook-mirror")
	var probe corev1.SecretList
	if err := kc.List(ctx, &probe, client.InNamespace(ns), client.HasLabels{kubeevents.LabelWebhookID}, client.Limit(1)); apierrors.IsForbidden(err) {
		log.Warn("cannot list Secrets: webhooks registered through serve --kubernetes are not delivered from this node (grant get, list and watch on secrets in --kube-webhooks-namespace: deploy/k8s/rbac.yaml's Role agentbox-webhook-reader)", "namespace", ns, "err", err)
		return nil
	}
	m := kubeevents.NewMirror(kc, ns, st, filepath.Join(c.DataDir, "kube-webhooks.json"), log)
	go m.Run(ctx, kubeevents.DefaultMirrorInterval)
	return nil
}
