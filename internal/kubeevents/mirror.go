package kubeevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// MirrorStore is what a node agent's mirror writes (*store.Store).
type MirrorStore interface {
	FindTeam(ctx context.Context, ref string) (store.Team, error)
	GetWebhook(ctx context.Context, teamID, id string) (store.WebhookRow, error)
	CreateWebhook(ctx context.Context, w store.WebhookRow, max int, flag string) error
	UpdateWebhook(ctx context.Context, w store.WebhookRow) error
	DeleteWebhook(ctx context.Context, teamID, id string) error
}

// Mirror keeps a node agent's store's copy of the cluster's webhooks, so
// the agent's events service delivers the events it makes to them. The
// agent's own webhooks (registered on its own API) are left alone: the
// mirror removes only what it added, remembered in a file across restarts.
type Mirror struct {
	c         client.Reader
	ns        string
	st        MirrorStore
	statePath string
	log       *slog.Logger
}

// NewMirror returns the mirror of the webhook Secrets of namespace ns;
// statePath is a file private to the agent.
func NewMirror(c client.Reader, ns string, st MirrorStore, statePath string, log *slog.Logger) *Mirror {
	return &Mirror{c: c, ns: ns, st: st, statePath: statePath, log: log}
}

// DefaultMirrorInterval is how often a node agent reads the webhook Secrets.
const DefaultMirrorInterval = 3 * time.Second

// Run syncs every interval until ctx ends.
func (m *Mirror) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := m.Sync(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("mirror the cluster's webhooks", "namespace", m.ns, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// load reads the webhooks the mirror added: id -> local team id.
func (m *Mirror) load() (map[string]string, error) {
	known := map[string]string{}
	b, err := os.ReadFile(m.statePath)
	if errors.Is(err, os.ErrNotExist) {
		return known, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &known); err != nil {
		return nil, fmt.Errorf("%s: %w", m.statePath, err)
	}
	return known, nil
}

func (m *Mirror) save(known map[string]string) error {
	b, err := json.Marshal(known)
	if err != nil {
		return err
	}
	tmp := m.statePath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, m.statePath)
}

// Sync makes the store's mirrored webhooks those of the Secrets: added,
// changed and removed. A team no sandbox of which ever ran here has no
// local team yet; its webhooks are mirrored once it has.
func (m *Mirror) Sync(ctx context.Context) error {
	known, err := m.load()
	if err != nil {
		return err
	}
	var list corev1.SecretList
	if err := m.c.List(ctx, &list, client.InNamespace(m.ns), client.HasLabels{LabelWebhookID}); err != nil {
		return fmt.Errorf("list webhook Secrets in %s: %w", m.ns, err)
	}
	changed := false
	seen := map[string]bool{}
	var errs []error
	for i := range list.Items {
		sec := &list.Items[i]
		if sec.Type != WebhookSecretType || !sec.DeletionTimestamp.IsZero() {
			continue
		}
		w, err := fromSecret(sec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t, err := m.st.FindTeam(ctx, w.TeamID)
		if errors.Is(err, errdefs.ErrNotFound) || (err == nil && t.Name != w.TeamID) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if team, ok := known[w.ID]; ok && team != t.ID {
			continue // a team is never changed under a webhook: leave it to be removed
		}
		seen[w.ID] = true
		w.TeamID = t.ID
		have, err := m.st.GetWebhook(ctx, t.ID, w.ID)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			if err := m.st.CreateWebhook(ctx, w, 0, ""); err != nil {
				errs = append(errs, fmt.Errorf("webhook %s of team %s: %w", w.ID, t.Name, err))
				continue
			}
			m.log.Info("mirrored a cluster webhook", "team", t.Name, "webhook", w.ID)
		case err != nil:
			errs = append(errs, err)
			continue
		case have.Name != w.Name || have.URL != w.URL || have.Enabled != w.Enabled || have.Secret != w.Secret || !slices.Equal(have.Events, w.Events):
			if err := m.st.UpdateWebhook(ctx, w); err != nil {
				errs = append(errs, fmt.Errorf("webhook %s of team %s: %w", w.ID, t.Name, err))
				continue
			}
		}
		if known[w.ID] == "" {
			known[w.ID] = t.ID
			changed = true
		}
	}
	for id, team := range known {
		if seen[id] {
			continue
		}
		if err := m.st.DeleteWebhook(ctx, team, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, fmt.Errorf("remove webhook %s: %w", id, err))
			continue
		}
		m.log.Info("removed a cluster webhook", "webhook", id)
		delete(known, id)
		changed = true
	}
	if changed {
		if err := m.save(known); err != nil {
			errs = append(errs, fmt.Errorf("remember the mirrored webhooks: %w", err))
		}
	}
	return errors.Join(errs...)
}
