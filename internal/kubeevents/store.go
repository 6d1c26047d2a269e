package kubeevents

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
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
	hooksNS   string
	leaseNS   string
	feedToken string
	http      *http.Client
	log       *slog.Logger

	mu      sync.Mutex
	pending map[string]pendingCount // webhook id -> owed deliveries, as last read
}

// pendingCount is a webhook's owed deliveries summed over the agents at.
type pendingCount struct {
	n  int
	at time.Time
}

// pendingTTL is how long a pending figure read with a webhook's row is
// reported: the view of a webhook is made right after its row is read.
const pendingTTL = 30 * time.Second

var _ events.Store = (*Store)(nil)

// NewStore returns the API tier's store. hooksNS holds the webhook Secrets (and nothing else),
// leaseNS the node agents' Leases (their addresses); secret is the token
// secret the agents share.
func NewStore(c client.Client, hooksNS, leaseNS string, secret []byte, log *slog.Logger) *Store {
	return &Store{c: c, hooksNS: hooksNS, leaseNS: leaseNS, feedToken: FeedToken(secret),
		http: &http.Client{Timeout: 10 * time.Second}, log: log, pending: map[string]pendingCount{}}
}

// ---- events: merged from the node agents ----

// agent is a node agent the feed is read from.
type agent struct{ node, addr string }

// reach is who can be asked: the node agents whose Lease is live, and why
// the others whose events may still be kept are not asked.
type reach struct {
	live    []agent
	missing []string // one reason per agent not asked
}

// agents lists the node agents to ask. An agent whose Lease ran out is not
// asked (it is gone, or cut off from the cluster; its address may now be
// another pod's, and the feed token is not sent there): its events are
// missing until it returns. One whose Lease ran out before since keeps no
// event still served, and is not missed.
func (s *Store) agents(ctx context.Context, since time.Time) (reach, error) {
	var leases coordv1.LeaseList
	if err := s.c.List(ctx, &leases, client.InNamespace(s.leaseNS), client.MatchingLabels{kube.LabelNodeAgent: "true"}); err != nil {
		return reach{}, fmt.Errorf("list node agent Leases in %s: %w", s.leaseNS, err)
	}
	now := time.Now()
	var out reach
	for _, l := range leases.Items {
		var st kube.NodeStatus
		if err := json.Unmarshal([]byte(l.Annotations[kube.AnnotationNodeStatus]), &st); err != nil || st.Node == "" {
			continue
		}
		r, d := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds
		if r == nil || d == nil || !now.Before(r.Add(time.Duration(*d)*time.Second)) {
			if r != nil && r.Time.Before(since) {
				continue
			}
			s.log.Debug("events: node agent Lease expired, its events are missing from answers until it returns", "node", st.Node)
			out.missing = append(out.missing, "Lease expired")
			continue
		}
		if st.Address == "" {
			s.log.Warn("events: node agent reports no address on its Lease (run it with --kube-advertise-address), its events cannot be read", "node", st.Node)
			out.missing = append(out.missing, "no address on its Lease")
			continue
		}
		out.live = append(out.live, agent{node: st.Node, addr: st.Address})
	}
	return out, nil
}

// get reads path?q of agent a into v.
func (s *Store) get(ctx context.Context, a agent, path string, q url.Values, v any) error {
	u := "http://" + a.addr + path + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.feedToken)
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("read node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("read node %s: the agent answered %s: %s (do the agent and this replica share --token-secret-file?): %w", a.node, resp.Status, body, errdefs.ErrUnavailable)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("read node %s: %w: %w", a.node, err, errdefs.ErrUnavailable)
	}
	return nil
}

// read asks one agent for the first depth events of f.
func (s *Store) read(ctx context.Context, a agent, f store.EventFilter, depth int) ([]json.RawMessage, error) {
	var out []json.RawMessage
	if err := s.get(ctx, a, FeedPath, feedQuery(f, depth), &out); err != nil {
		return nil, fmt.Errorf("events: %w", err)
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
// returns the page asked for. When some agents cannot be read (gone, or
// not answering) it returns the others' page with an
// *events.IncompleteError saying how many and why, so the caller sees what
// there is and knows it is not all; when none can, it fails.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]string, error) {
	depth := f.Offset + f.Limit
	if depth > MaxDepth {
		return nil, fmt.Errorf("offset %d: the cluster tier pages at most %d events deep (offset + limit); narrow the request with types or a sandbox id, or page newest-first and oldest-first: %w", f.Offset, MaxDepth, errdefs.ErrInvalidArgument)
	}
	rc, err := s.agents(ctx, f.Since)
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		all  []timed
		errs []error
		wg   sync.WaitGroup
	)
	for _, a := range rc.live {
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
	for _, err := range errs {
		s.log.Warn("events: a node agent did not answer, its events are missing from this answer", "err", err)
	}
	total := len(rc.live) + len(rc.missing)
	if read := len(rc.live) - len(errs); total > 0 && read == 0 {
		return nil, fmt.Errorf("no node agent could be read for events (%s): try again when they are back: %w", missingWhy(rc.missing, len(errs)), errdefs.ErrUnavailable)
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
	if n := len(rc.missing) + len(errs); n > 0 {
		return out, &events.IncompleteError{Missing: fmt.Sprintf("%d of %d node agents not read (%s): the events of sandboxes that ran there are missing until they return",
			n, total, missingWhy(rc.missing, len(errs)))}
	}
	return out, nil
}

// missingWhy counts the reasons agents were not read, e.g. "1 Lease
// expired, 2 did not answer".
func missingWhy(missing []string, failed int) string {
	n := map[string]int{}
	for _, m := range missing {
		n[m]++
	}
	if failed > 0 {
		n["did not answer"] += failed
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		out = append(out, fmt.Sprintf("%d %s", n[k], k))
	}
	return strings.Join(out, ", ")
}

// ---- webhooks: Secrets ----

func notFound(id string) error {
	return fmt.Errorf("webhook %q not found: %w", id, errdefs.ErrNotFound)
}

// ListWebhooks returns the team's webhooks, oldest first.
func (s *Store) ListWebhooks(ctx context.Context, team string) ([]store.WebhookRow, error) {
	var list corev1.SecretList
	if err := s.c.List(ctx, &list, client.InNamespace(s.hooksNS), client.MatchingLabels{kube.LabelTeam: team}, client.HasLabels{LabelWebhookID}); err != nil {
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
	s.stats(ctx, team, out)
	return out, nil
}

// stats fills the rows' Dropped and LastError with the agents' figures
// (they deliver) and notes their owed deliveries for PendingDeliveries.
// An agent that cannot be read adds nothing: the figures are what could
// be read (logged), never a failure of the request.
func (s *Store) stats(ctx context.Context, team string, rows []store.WebhookRow) {
	if len(rows) == 0 {
		return
	}
	rc, err := s.agents(ctx, time.Time{})
	if err != nil {
		s.log.Warn("webhook figures: list the node agents", "err", err)
		return
	}
	var (
		mu  sync.Mutex
		got = map[string][]WebhookStats{} // node -> figures
		wg  sync.WaitGroup
	)
	for _, a := range rc.live {
		wg.Go(func() {
			var st []WebhookStats
			if err := s.get(ctx, a, StatsPath, url.Values{"team": {team}}, &st); err != nil {
				s.log.Warn("webhook figures: a node agent did not answer; its part is not counted", "err", err)
				return
			}
			mu.Lock()
			got[a.node] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	pending := map[string]int{}
	for i := range rows {
		rows[i].Dropped, rows[i].LastError = 0, ""
	}
	for _, node := range slices.Sorted(maps.Keys(got)) {
		for _, st := range got[node] {
			i := slices.IndexFunc(rows, func(w store.WebhookRow) bool { return w.ID == st.ID })
			if i < 0 {
				continue // the agent's own webhook, not the cluster's
			}
			pending[st.ID] += st.Pending
			rows[i].Dropped += st.Dropped
			if rows[i].LastError == "" && st.LastError != "" {
				rows[i].LastError = "node " + node + ": " + st.LastError
			}
		}
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, p := range s.pending {
		if now.Sub(p.at) > pendingTTL {
			delete(s.pending, id)
		}
	}
	for _, w := range rows {
		s.pending[w.ID] = pendingCount{n: pending[w.ID], at: now}
	}
}

// secretOf returns the team's webhook Secret id; another team's is not found.
func (s *Store) secretOf(ctx context.Context, team, id string) (*corev1.Secret, store.WebhookRow, error) {
	if !validID(id) {
		return nil, store.WebhookRow{}, notFound(id)
	}
	var sec corev1.Secret
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.hooksNS, Name: SecretPrefix + id}, &sec)
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

// GetWebhook returns the team's webhook id, with the agents' figures.
func (s *Store) GetWebhook(ctx context.Context, team, id string) (store.WebhookRow, error) {
	_, w, err := s.secretOf(ctx, team, id)
	if err != nil {
		return w, err
	}
	rows := []store.WebhookRow{w}
	s.stats(ctx, team, rows)
	return rows[0], nil
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
	sec, err := toSecret(s.hooksNS, w)
	if err != nil {
		return err
	}
	if err := s.c.Create(ctx, sec); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			// The operator's to fix, not the caller's: say what is missing.
			return fmt.Errorf("webhooks cannot be kept: namespace %s (--kube-webhooks-namespace) is missing or this replica may not write Secrets there (deploy/k8s/namespace.yaml and agentbox-api.yaml make both): %w", s.hooksNS, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("create webhook Secret %s/%s: %w", s.hooksNS, sec.Name, err)
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
		return fmt.Errorf("update webhook Secret %s/%s: %w", s.hooksNS, sec.Name, err)
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
		return fmt.Errorf("delete webhook Secret %s/%s: %w", s.hooksNS, sec.Name, err)
	}
	return nil
}

// PendingDeliveries is the webhook's owed deliveries summed over the node
// agents, as read with its row (ListWebhooks, GetWebhook) just before; a
// webhook not read lately (one just created) is owed none yet.
func (s *Store) PendingDeliveries(_ context.Context, id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.pending[id]; ok && time.Since(p.at) <= pendingTTL {
		return p.n, nil
	}
	return 0, nil
}

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
