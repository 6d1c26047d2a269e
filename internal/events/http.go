package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/store"
)

// TeamFunc names the team of an authenticated request.
type TeamFunc func(*http.Request) string

// Routes returns the events API's handlers by ServeMux pattern. Every
// route must be served behind the API key check; team names the caller's
// team, and every object a route touches is looked up within it.
func (s *Service) Routes(team TeamFunc) map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /events/sandboxes":               func(w http.ResponseWriter, r *http.Request) { s.listEvents(w, r, team(r), "") },
		"GET /events/sandboxes/{sandboxID}":   func(w http.ResponseWriter, r *http.Request) { s.listEvents(w, r, team(r), r.PathValue("sandboxID")) },
		"POST /events/webhooks":               func(w http.ResponseWriter, r *http.Request) { s.createWebhook(w, r, team(r)) },
		"GET /events/webhooks":                func(w http.ResponseWriter, r *http.Request) { s.listWebhooks(w, r, team(r)) },
		"GET /events/webhooks/{webhookID}":    func(w http.ResponseWriter, r *http.Request) { s.getWebhook(w, r, team(r)) },
		"PATCH /events/webhooks/{webhookID}":  func(w http.ResponseWriter, r *http.Request) { s.patchWebhook(w, r, team(r)) },
		"DELETE /events/webhooks/{webhookID}": func(w http.ResponseWriter, r *http.Request) { s.deleteWebhook(w, r, team(r)) },
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ---- events ----

// Paging of the events API (E2B's).
const (
	defaultLimit = 10
	maxLimit     = 100
)

// EventQuery is a parsed events request.
type EventQuery struct {
	Offset, Limit int
	Asc           bool
	Types         []string
}

// ParseEventQuery reads offset, limit, orderAsc and types (repeated, or
// comma-separated) as E2B's events API takes them.
func ParseEventQuery(q url.Values) (EventQuery, error) {
	out := EventQuery{Limit: defaultLimit}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return out, invalid("offset %q: want a whole number of events to skip, 0 or more", v)
		}
		out.Offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return out, invalid("limit %q: want a number of events from 1 to %d", v, maxLimit)
		}
		out.Limit = n
	}
	if v := q.Get("orderAsc"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return out, invalid("orderAsc %q: want true (oldest first) or false (newest first)", v)
		}
		out.Asc = b
	}
	for _, v := range q["types"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			if !ValidType(t) {
				return out, invalid("types %q: not an event type; want one of %s", t, strings.Join(Types, ", "))
			}
			out.Types = append(out.Types, t)
		}
	}
	return out, nil
}

func (s *Service) listEvents(w http.ResponseWriter, r *http.Request, team, sandboxID string) {
	q, err := ParseEventQuery(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	bodies, err := s.st.ListEvents(r.Context(), store.EventFilter{TeamID: team, SandboxID: sandboxID, Types: q.Types,
		Since: s.now().Add(-s.cfg.MaxAge), Offset: q.Offset, Limit: q.Limit, Asc: q.Asc})
	var inc *IncompleteError
	if errors.As(err, &inc) {
		w.Header().Set(IncompleteHeader, inc.Missing)
	} else if err != nil {
		httperr.Write(w, err)
		return
	}
	// Stored bodies are already the wire form: joined, not re-encoded.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "["+strings.Join(bodies, ",")+"]\n")
}

// IncompleteHeader is set on an events answer that lacks some events the
// server could not read at the time (the cluster tier: a node agent that
// is gone or does not answer), saying what is missing. The body is the
// events that could be read, paged as if they were all there were.
const IncompleteHeader = "Agentbox-Events-Incomplete"

// IncompleteError is what a Store's ListEvents returns with the events it
// could read when part of them could not be read: the route serves those
// events with IncompleteHeader set to Missing. Any other error fails it.
type IncompleteError struct{ Missing string }

func (e *IncompleteError) Error() string { return "events incomplete: " + e.Missing }

// ---- webhooks ----

// Webhook is a webhook as the API shows it (E2B's names). The signature
// secret is never shown: its owner chose it.
type Webhook struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	// agentbox: what is owed and what went wrong.
	PendingDeliveries int    `json:"pendingDeliveries"`
	DroppedDeliveries int64  `json:"droppedDeliveries,omitempty"`
	LastError         string `json:"lastError,omitempty"`
}

// webhookRequest is the body of POST and PATCH (E2B's names). Pointers
// tell an absent field from an empty one for PATCH.
type webhookRequest struct {
	Name            *string   `json:"name"`
	URL             *string   `json:"url"`
	Enabled         *bool     `json:"enabled"`
	Events          *[]string `json:"events"`
	SignatureSecret *string   `json:"signatureSecret"`
}

// Bounds of a webhook's fields.
const (
	maxNameBytes   = 256
	maxURLBytes    = 2048
	maxSecretBytes = 1024
	minSecretBytes = 8
	maxBodyBytes   = 64 << 10
)

func decodeWebhook(r *http.Request) (webhookRequest, error) {
	var req webhookRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, invalid("webhook body: %v; want JSON {name, url, enabled, events, signatureSecret}", err)
	}
	return req, nil
}

// checkFields validates w's fields as a request set them.
func (s *Service) checkFields(ctx context.Context, w *store.WebhookRow) error {
	if len(w.Name) > maxNameBytes {
		return invalid("name: %d bytes; at most %d", len(w.Name), maxNameBytes)
	}
	if len(w.Events) == 0 {
		return invalid("events: empty; list the event types to receive, e.g. [%q]", TypeCreated)
	}
	seen := map[string]bool{}
	var evs []string
	for _, t := range w.Events {
		if !ValidType(t) {
			return invalid("events: %q is not an event type; want any of %s", t, strings.Join(Types, ", "))
		}
		if !seen[t] {
			seen[t] = true
			evs = append(evs, t)
		}
	}
	w.Events = evs
	if n := len(w.Secret); n < minSecretBytes || n > maxSecretBytes {
		return invalid("signatureSecret: %d bytes; want %d to %d (a random string; deliveries are signed with it in e2b-signature)", n, minSecretBytes, maxSecretBytes)
	}
	return s.CheckURL(ctx, w.URL)
}

// CheckURL refuses a webhook address the destination policy closes, at
// registration: deliveries are checked again at every connect (a name may
// resolve elsewhere later), so this is for a clear answer, not the defence.
func (s *Service) CheckURL(ctx context.Context, raw string) error {
	if len(raw) > maxURLBytes {
		return invalid("url: %d bytes; at most %d", len(raw), maxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return invalid("url %q: want an absolute http:// or https:// URL, e.g. https://hooks.example.com/e2b", raw)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return invalid("url %q: bad port", raw)
	}
	dest := net.JoinHostPort(host, port)
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		// A name that does not resolve now is checked at delivery.
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		addrs, _ = net.DefaultResolver.LookupNetIP(rctx, "ip", host)
		cancel()
	}
	for _, a := range addrs {
		if err := s.policy.Check(dest, host, a, uint16(p)); err != nil {
			return fmt.Errorf("url: %w", err)
		}
	}
	return nil
}

func (s *Service) view(ctx context.Context, w store.WebhookRow) Webhook {
	n, _ := s.st.PendingDeliveries(ctx, w.ID)
	return Webhook{ID: w.ID, TeamID: w.TeamID, Name: w.Name, CreatedAt: w.CreatedAt, Enabled: w.Enabled, URL: w.URL, Events: w.Events,
		PendingDeliveries: n, DroppedDeliveries: w.Dropped, LastError: w.LastError}
}

func (s *Service) createWebhook(w http.ResponseWriter, r *http.Request, team string) {
	req, err := decodeWebhook(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	switch {
	case req.URL == nil:
		httperr.Write(w, invalid("url: missing; the address deliveries are POSTed to"))
		return
	case req.Events == nil:
		httperr.Write(w, invalid("events: missing; list the event types to receive, e.g. [%q]", TypeCreated))
		return
	case req.SignatureSecret == nil:
		httperr.Write(w, invalid("signatureSecret: missing; a secret of yours that signs each delivery (e2b-signature)"))
		return
	}
	row := store.WebhookRow{ID: uuid.NewString(), TeamID: team, URL: *req.URL, Events: *req.Events, Secret: *req.SignatureSecret,
		Enabled: true, CreatedAt: s.now().UTC()}
	if req.Name != nil {
		row.Name = *req.Name
	}
	if req.Enabled != nil {
		row.Enabled = *req.Enabled
	}
	if err := s.checkFields(r.Context(), &row); err != nil {
		httperr.Write(w, err)
		return
	}
	if err := s.st.CreateWebhook(r.Context(), row, s.cfg.MaxWebhooks, s.cfg.MaxWebhooksFlag); err != nil {
		httperr.Write(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.view(r.Context(), row))
}

func (s *Service) listWebhooks(w http.ResponseWriter, r *http.Request, team string) {
	rows, err := s.st.ListWebhooks(r.Context(), team)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := make([]Webhook, 0, len(rows))
	for _, x := range rows {
		out = append(out, s.view(r.Context(), x))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) getWebhook(w http.ResponseWriter, r *http.Request, team string) {
	row, err := s.st.GetWebhook(r.Context(), team, r.PathValue("webhookID"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.view(r.Context(), row))
}

func (s *Service) patchWebhook(w http.ResponseWriter, r *http.Request, team string) {
	row, err := s.st.GetWebhook(r.Context(), team, r.PathValue("webhookID"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	req, err := decodeWebhook(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if req.Name != nil {
		row.Name = *req.Name
	}
	if req.URL != nil {
		row.URL = *req.URL
	}
	if req.Enabled != nil {
		row.Enabled = *req.Enabled
	}
	if req.Events != nil {
		row.Events = *req.Events
	}
	if req.SignatureSecret != nil {
		row.Secret = *req.SignatureSecret
	}
	if err := s.checkFields(r.Context(), &row); err != nil {
		httperr.Write(w, err)
		return
	}
	if err := s.st.UpdateWebhook(r.Context(), row); err != nil {
		httperr.Write(w, err)
		return
	}
	if row.Enabled {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	writeJSON(w, http.StatusOK, s.view(r.Context(), row))
}

func (s *Service) deleteWebhook(w http.ResponseWriter, r *http.Request, team string) {
	if err := s.st.DeleteWebhook(r.Context(), team, r.PathValue("webhookID")); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
