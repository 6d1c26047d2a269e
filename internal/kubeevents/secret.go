// Package kubeevents serves lifecycle events and webhooks on the cluster
// tier (serve --kubernetes), which keeps no store of its own.
//
// Events are made where sandboxes run: every node agent derives them from
// its own audit log into its own store (internal/events), as a single
// server does. The API tier serves GET /events/sandboxes by asking every
// live node agent for the caller's team's events (the feed, authenticated
// with a token derived from the token secret the agents and replicas
// share) and merging the answers, so the wire shape, team scoping and
// paging are internal/events' own. When an agent cannot be read (its Lease
// ran out, or it does not answer) the others' events are served with
// header events.IncompleteHeader saying what is missing.
//
// Webhooks registered through the API tier are kept in the cluster, one
// Secret each in a namespace of their own (--kube-webhooks-namespace: the
// signature secret is a secret, and node agents may read that namespace
// but never the API keys'). Every node agent mirrors them into its own
// store, so the one deliverer of an event is the events service of the
// agent that made it: durable at-least-once delivery, retries, the
// per-team queue bound and the destination policy of that agent all hold
// unchanged. The figures of a webhook's queue (pendingDeliveries,
// droppedDeliveries, lastError) are the agents' too, read through the feed.
package kubeevents

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/store"
)

// Webhook Secrets: type WebhookSecretType in the webhooks namespace, named
// SecretPrefix+id, labelled kube.LabelTeam=TEAM and LabelWebhookID=id.
const (
	WebhookSecretType = "agentbox.dev/webhook"
	LabelWebhookID    = "agentbox.dev/webhook-id"
	SecretPrefix      = "agentbox-webhook-"
)

// Data fields of a webhook Secret.
const (
	fieldName      = "name"
	fieldURL       = "url"
	fieldEnabled   = "enabled"
	fieldEvents    = "events"
	fieldSecret    = "signatureSecret"
	fieldCreatedAt = "createdAt"
)

// toSecret is w as a Secret of namespace ns.
func toSecret(ns string, w store.WebhookRow) (*corev1.Secret, error) {
	evs, err := json.Marshal(w.Events)
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{Type: WebhookSecretType}
	sec.Namespace, sec.Name = ns, SecretPrefix+w.ID
	sec.Labels = map[string]string{kube.LabelTeam: w.TeamID, LabelWebhookID: w.ID}
	setData(sec, w, evs)
	return sec, nil
}

func setData(sec *corev1.Secret, w store.WebhookRow, evs []byte) {
	sec.Data = map[string][]byte{
		fieldName:      []byte(w.Name),
		fieldURL:       []byte(w.URL),
		fieldEnabled:   []byte(strconv.FormatBool(w.Enabled)),
		fieldEvents:    evs,
		fieldSecret:    []byte(w.Secret),
		fieldCreatedAt: []byte(w.CreatedAt.UTC().Format(time.RFC3339Nano)),
	}
}

// fromSecret reads a webhook Secret; the team is its label.
func fromSecret(sec *corev1.Secret) (store.WebhookRow, error) {
	w := store.WebhookRow{ID: sec.Labels[LabelWebhookID], TeamID: sec.Labels[kube.LabelTeam],
		Name: string(sec.Data[fieldName]), URL: string(sec.Data[fieldURL]), Secret: string(sec.Data[fieldSecret])}
	if sec.Type != WebhookSecretType || w.ID == "" || w.TeamID == "" || sec.Name != SecretPrefix+w.ID {
		return w, fmt.Errorf("secret %s/%s is not a webhook (type %s, labels %s and %s, named %s<id>)", sec.Namespace, sec.Name, WebhookSecretType, kube.LabelTeam, LabelWebhookID, SecretPrefix)
	}
	var err error
	if w.Enabled, err = strconv.ParseBool(string(sec.Data[fieldEnabled])); err != nil {
		return w, fmt.Errorf("webhook secret %s/%s: %s: %w", sec.Namespace, sec.Name, fieldEnabled, err)
	}
	if err := json.Unmarshal(sec.Data[fieldEvents], &w.Events); err != nil {
		return w, fmt.Errorf("webhook secret %s/%s: %s: %w", sec.Namespace, sec.Name, fieldEvents, err)
	}
	if w.CreatedAt, err = time.Parse(time.RFC3339Nano, string(sec.Data[fieldCreatedAt])); err != nil {
		return w, fmt.Errorf("webhook secret %s/%s: %s: %w", sec.Namespace, sec.Name, fieldCreatedAt, err)
	}
	return w, nil
}
