package kubeevents

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/store"
)

// FeedPath is the node agent's route the API tier reads events from. It is
// not an E2B route: only a holder of the cluster's token secret may call it.
const FeedPath = "/agentbox/cluster/events"

// StatsPath is the node agent's route the API tier reads the delivery
// figures of a team's webhooks from, with the feed's token.
const StatsPath = "/agentbox/cluster/webhook-stats"

// WebhookStats are one webhook's delivery figures on one node agent.
type WebhookStats struct {
	ID        string `json:"id"`
	Pending   int    `json:"pending"`
	Dropped   int64  `json:"dropped"`
	LastError string `json:"lastError,omitempty"`
}

// MaxDepth bounds how deep the API tier pages (offset + limit): every node
// agent sends up to that many events per request, to be merged.
const MaxDepth = 1100

// FeedToken is the bearer token of the feed, derived from the token secret
// node agents and API replicas share (never the secret itself).
func FeedToken(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("agentbox cluster events feed v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// FeedStore is what the feed reads on a node agent (*store.Store).
type FeedStore interface {
	FindTeam(ctx context.Context, ref string) (store.Team, error)
	ListEvents(ctx context.Context, f store.EventFilter) ([]string, error)
	ListWebhooks(ctx context.Context, teamID string) ([]store.WebhookRow, error)
	PendingDeliveries(ctx context.Context, webhookID string) (int, error)
}

// Feed serves FeedPath and StatsPath on a node agent and passes every
// other request to next. secret is the shared token secret; without one there is no feed.
func Feed(next http.Handler, secret []byte, st FeedStore, log *slog.Logger) http.Handler {
	if len(secret) == 0 {
		return next
	}
	want := []byte("Bearer " + FeedToken(secret))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != FeedPath && r.URL.Path != StatsPath {
			next.ServeHTTP(w, r)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			httperr.Write(w, fmt.Errorf("%s serves the cluster's API replicas only: %w", r.URL.Path, errdefs.ErrUnauthenticated))
			return
		}
		if r.Method != http.MethodGet {
			httperr.Write(w, fmt.Errorf("%s %s: only GET: %w", r.Method, r.URL.Path, errdefs.ErrInvalidArgument))
			return
		}
		var (
			bodies any
			err    error
		)
		if r.URL.Path == StatsPath {
			bodies, err = stats(r.Context(), st, r.URL.Query().Get("team"))
		} else {
			bodies, err = feed(r.Context(), st, r.URL.Query())
		}
		if err != nil {
			log.Warn("cluster events feed", "err", err)
			httperr.Write(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(bodies)
	})
}

// feedQuery encodes f for the feed, asking for the first depth events.
func feedQuery(f store.EventFilter, depth int) url.Values {
	q := url.Values{"team": {f.TeamID}, "limit": {strconv.Itoa(depth)}, "asc": {strconv.FormatBool(f.Asc)}}
	if f.SandboxID != "" {
		q.Set("sandboxID", f.SandboxID)
	}
	if len(f.Types) > 0 {
		q.Set("types", strings.Join(f.Types, ","))
	}
	if !f.Since.IsZero() {
		q.Set("since", strconv.FormatInt(f.Since.UnixNano(), 10))
	}
	return q
}

// feed answers one feed request: the team's events, named by the team's
// name as the cluster knows it (a node agent's team id is its own).
func feed(ctx context.Context, st FeedStore, q url.Values) ([]json.RawMessage, error) {
	name := q.Get("team")
	f := store.EventFilter{SandboxID: q.Get("sandboxID"), Asc: q.Get("asc") == "true"}
	var err error
	if f.Limit, err = strconv.Atoi(q.Get("limit")); err != nil || f.Limit < 1 || f.Limit > MaxDepth {
		return nil, fmt.Errorf("limit %q: want 1 to %d: %w", q.Get("limit"), MaxDepth, errdefs.ErrInvalidArgument)
	}
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("since %q: want Unix nanoseconds: %w", v, errdefs.ErrInvalidArgument)
		}
		f.Since = time.Unix(0, n)
	}
	if v := q.Get("types"); v != "" {
		f.Types = strings.Split(v, ",")
	}
	out := []json.RawMessage{}
	if name == "" {
		return nil, fmt.Errorf("team: missing: %w", errdefs.ErrInvalidArgument)
	}
	t, err := st.FindTeam(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && t.Name != name) {
		// No sandbox of the team ever ran here. (FindTeam also matches
		// ids: a cluster team named like a local id is not that team.)
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	f.TeamID = t.ID
	bodies, err := st.ListEvents(ctx, f)
	if err != nil {
		return nil, err
	}
	for _, b := range bodies {
		var e events.Event
		if err := json.Unmarshal([]byte(b), &e); err != nil {
			return nil, fmt.Errorf("stored event: %w", err)
		}
		e.SandboxTeamID = name
		raw, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		out = append(out, raw)
	}
	return out, nil
}

// stats answers one StatsPath request: the delivery figures of the
// webhooks of the team (by its cluster name) this agent holds.
func stats(ctx context.Context, st FeedStore, name string) ([]WebhookStats, error) {
	if name == "" {
		return nil, fmt.Errorf("team: missing: %w", errdefs.ErrInvalidArgument)
	}
	out := []WebhookStats{}
	t, err := st.FindTeam(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && t.Name != name) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	rows, err := st.ListWebhooks(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	for _, w := range rows {
		n, err := st.PendingDeliveries(ctx, w.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, WebhookStats{ID: w.ID, Pending: n, Dropped: w.Dropped, LastError: w.LastError})
	}
	return out, nil
}
