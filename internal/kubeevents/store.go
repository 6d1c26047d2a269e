package kubeevents

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/store"
)

// Store is the API tier's events.Store: events merged from the node
// agents' feeds, webhooks in Secrets. It derives and delivers nothing (the
// node agents do), so the API tier serves events.Service's routes with it
// and never runs the service.
type Store struct {
	c         client.Client // uncached: a webhook written is read back at once
	keysNS    string
	leaseNS   string
	feedToken string
	http      *http.Client
	log       *slog.Logger
}

var _ events.Store = (*Store)(nil)

// NewStore returns the API tier's store. keysNS holds the webhook Secrets,
// leaseNS the node agents' Leases (their addresses); secret is the token
// secret the agents share.
func NewStore(c client.Client, keysNS, leaseNS string, secret []byte, log *slog.Logger) *Store {
	return &Store{c: c, keysNS: keysNS, leaseNS: leaseNS, feedToken: FeedToken(secret),
		http: &http.Client{Timeout: 10 * time.Second}, log: log}
}

// ---- events: merged from the node agents ----

// agent is a node agent the feed is read from.
type agent struct{ node, addr string }

// agents lists the node agents whose Lease is live. An agent whose Lease
// ran out is gone (its sandboxes are marked NodeLost); its events come
// back with it.
func (s *Store) agents(ctx context.Context) ([]agent, error) {
	var leases coordv1.LeaseList
	if err := s.c.List(ctx, &leases, client.InNamespace(s.leaseNS), client.MatchingLabels{kube.LabelNodeAgent: "true"}); err != nil {
		return nil, fmt.Errorf("list node agent Leases in %s: %w", s.leaseNS, err)
	}
	now := time.Now()
	var out []agent
	for _, l := range leases.Items {
		var st kube.NodeStatus
		if err := json.Unmarshal([]byte(l.Annotations[kube.AnnotationNodeStatus]), &st); err != nil || st.Node == "" {
			continue
		}
		r, d := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds
		if r == nil || d == nil || !now.Before(r.Add(time.Duration(*d)*time.Second)) {
			s.log.Debug("events: node agent Lease expired, its events are not served until it returns", "node", st.Node)
			continue
		}
		if st.Address == "" {
			return nil, fmt.Errorf("the agent of node %s reports no address on its Lease (run it with --kube-advertise-address): its events cannot be read: %w", st.Node, errdefs.ErrUnavailable)
		}
		out = append(out, agent{node: st.Node, addr: st.Address})
	}
	return out, nil
}

// read asks one agent for the first depth events of f.
func (s *Store) read(ctx context.Context, a agent, f store.EventFilter, depth int) ([]json.RawMessage, error) {
	u := "http://" + a.addr + FeedPath + "?" + feedQuery(f, depth).Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.feedToken)
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the events of node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read the events of node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the events of node %s: the agent answered %s: %s (do the agent and this replica share --token-secret-file?): %w", a.node, resp.Status, body, errdefs.ErrUnavailable)
	}
	var out []json.RawMessage
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("read the events of node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	return out, nil
}

// timed is an event body with the fields it is ordered by.
type timed struct {
	at   time.Time
	id   string
	body json.RawMessage
}

// ListEvents merges the first Offset+Limit events of every live agent and
// returns the page asked for. A live agent that does not answer fails the
// request: a page with a node's events silently missing would mislead.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]string, error) {
	depth := f.Offset + f.Limit
	if depth > MaxDepth {
		return nil, fmt.Errorf("offset %d: the cluster tier pages at most %d events deep (offset + limit); narrow the request with types or a sandbox id, or page newest-first and oldest-first: %w", f.Offset, MaxDepth, errdefs.ErrInvalidArgument)
	}
	agents, err := s.agents(ctx)
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		all  []timed
		errs []error
		wg   sync.WaitGroup
	)
	for _, a := range agents {
		wg.Go(func() {
			bodies, err := s.read(ctx, a, f, depth)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, b := range bodies {
				var e struct {
					ID        string    `json:"id"`
					Timestamp time.Time `json:"timestamp"`
				}
				if json.Unmarshal(b, &e) == nil {
					all = append(all, timed{at: e.Timestamp, id: e.ID, body: b})
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortStableFunc(all, func(a, b timed) int {
		c := a.at.Compare(b.at)
		if c == 0 {
			c = cmp.Compare(a.id, b.id)
		}
		if !f.Asc {
			c = -c
		}
		return c
	})
	out := []string{}
	for i := f.Offset; i < len(all) && i < depth; i++ {
		out = append(out, string(all[i].body))
	}
	return out, nil
}

// ---- webhooks: Secrets ----

func notFound(id string) error {
	return fmt.Errorf("webhook %q not found: %w", id, errdefs.ErrNotFound)
}

// ListWebhooks returns the team's webhooks, oldest first.
func (s *Store) ListWebhooks(ctx context.Context, team string) ([]store.WebhookRow, error) {
	var list corev1.SecretList
	if err := s.c.List(ctx, &list, client.InNamespace(s.keysNS), client.MatchingLabels{kube.LabelTeam: team}, client.HasLabels{LabelWebhookID}); err != nil {
		return nil, fmt.Errorf("list the webhook Secrets of team %s: %w", team, err)
	}
	out := []store.WebhookRow{}
	for i := range list.Items {
		sec := &list.Items[i]
		if sec.Type != WebhookSecretType || !sec.DeletionTimestamp.IsZero() {
			continue
		}
		w, err := fromSecret(sec)
		if err != nil {
			s.log.Warn("skip a malformed webhook Secret", "err", err)
			continue
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b store.WebhookRow) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// secretOf returns the team's webhook Secret id; another team's is not found.
func (s *Store) secretOf(ctx context.Context, team, id string) (*corev1.Secret, store.WebhookRow, error) {
	if !validID(id) {
		return nil, store.WebhookRow{}, notFound(id)
	}
	var sec corev1.Secret
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.keysNS, Name: SecretPrefix + id}, &sec)
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return nil, store.WebhookRow{}, notFound(id)
	}
	if err != nil {
		return nil, store.WebhookRow{}, fmt.Errorf("read webhook %s: %w", id, err)
	}
	w, err := fromSecret(&sec)
	if err != nil || w.TeamID != team || w.ID != id || !sec.DeletionTimestamp.IsZero() {
		return nil, store.WebhookRow{}, notFound(id)
	}
	return &sec, w, nil
}

// validID reports whether id can name a webhook Secret (the ids this tier
// gives are UUIDs).
func validID(id string) bool {
	if id == "" || len(id) > 63-len(SecretPrefix) {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// GetWebhook returns the team's webhook id.
func (s *Store) GetWebhook(ctx context.Context, team, id string) (store.WebhookRow, error) {
	_, w, err := s.secretOf(ctx, team, id)
	return w, err
}

// CreateWebhook keeps w as a Secret, refusing past max webhooks of the
// team. (Two replicas creating at once may each pass the count: the bound
// can be passed by the number of replicas, never more.)
func (s *Store) CreateWebhook(ctx context.Context, w store.WebhookRow, max int, flag string) error {
	if max > 0 {
		have, err := s.ListWebhooks(ctx, w.TeamID)
		if err != nil {
			return err
		}
		if n := len(have); n >= max {
			return fmt.Errorf("the team has %d webhooks, the most this server allows: delete one (DELETE /events/webhooks/{webhookID}) or ask the operator to raise %s: %w", n, flag, errdefs.ErrResourceExhausted)
		}
	}
	sec, err := toSecret(s.keysNS, w)
	if err != nil {
		return err
	}
	if err := s.c.Create(ctx, sec); err != nil {
		return fmt.Errorf("create webhook Secret %s/%s: %w", s.keysNS, sec.Name, err)
	}
	return nil
}

// UpdateWebhook replaces the team's webhook w.ID's fields.
func (s *Store) UpdateWebhook(ctx context.Context, w store.WebhookRow) error {
	sec, old, err := s.secretOf(ctx, w.TeamID, w.ID)
	if err != nil {
		return err
	}
	w.CreatedAt = old.CreatedAt
	evs, err := json.Marshal(w.Events)
	if err != nil {
		return err
	}
	setData(sec, w, evs)
	if err := s.c.Update(ctx, sec); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("webhook %s changed meanwhile; send the change again: %w", w.ID, errdefs.ErrConflict)
		}
		return fmt.Errorf("update webhook Secret %s/%s: %w", s.keysNS, sec.Name, err)
	}
	return nil
}

// DeleteWebhook removes the team's webhook id; the node agents drop it and
// what it was owed at their next sync.
func (s *Store) DeleteWebhook(ctx context.Context, team, id string) error {
	sec, _, err := s.secretOf(ctx, team, id)
	if err != nil {
		return err
	}
	if err := s.c.Delete(ctx, sec, client.Preconditions{UID: &sec.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete webhook Secret %s/%s: %w", s.keysNS, sec.Name, err)
	}
	return nil
}

// PendingDeliveries is not known here: the deliveries are the node agents'.
func (s *Store) PendingDeliveries(context.Context, string) (int, error) { return 0, nil }

// ---- derivation and delivery: the node agents' ----

func (s *Store) InitEvents(context.Context) error            { return nil }
func (s *Store) EventsCursor(context.Context) (int64, error) { return 0, nil }
func (s *Store) AuditAfter(context.Context, int64, []string, int) ([]store.AuditRow, error) {
	return nil, nil
}
func (s *Store) AppendEvents(context.Context, store.EventBatch) (int, []store.Dropped, error) {
	return 0, nil, nil
}
func (s *Store) LastEventInfo(context.Context, string, string) (string, bool, error) {
	return "", false, nil
}
func (s *Store) PruneEvents(context.Context, time.Time) (int64, error) { return 0, nil }
func (s *Store) DueDeliveries(context.Context, time.Time, int) ([]store.DeliveryRow, error) {
	return nil, nil
}
func (s *Store) NextDelivery(context.Context) (time.Time, bool, error) {
	return time.Time{}, false, nil
}
func (s *Store) DeliveryDone(context.Context, string) error                          { return nil }
func (s *Store) DeliveryRetry(context.Context, string, int, time.Time, string) error { return nil }
func (s *Store) DeliveryFailed(context.Context, string, string, string) error        { return nil }
