package kubeevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/store"
)

var quiet = slog.New(slog.DiscardHandler)

// memStore is a node agent's store in memory: teams, events, webhooks.
type memStore struct {
	teams    []store.Team
	events   []store.EventRow
	webhooks map[string]store.WebhookRow
	pending  map[string]int // webhook id -> owed deliveries
}

func (m *memStore) ListWebhooks(_ context.Context, team string) ([]store.WebhookRow, error) {
	var out []store.WebhookRow
	for _, w := range m.webhooks {
		if w.TeamID == team {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b store.WebhookRow) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (m *memStore) PendingDeliveries(_ context.Context, id string) (int, error) {
	return m.pending[id], nil
}

func (m *memStore) FindTeam(_ context.Context, ref string) (store.Team, error) {
	for _, t := range m.teams {
		if t.ID == ref || t.Name == ref {
			return t, nil
		}
	}
	return store.Team{}, fmt.Errorf("team %q: %w", ref, errdefs.ErrNotFound)
}

func (m *memStore) ListEvents(_ context.Context, f store.EventFilter) ([]string, error) {
	var evs []store.EventRow
	for _, e := range m.events {
		if e.TeamID == f.TeamID && (f.SandboxID == "" || e.SandboxID == f.SandboxID) && (len(f.Types) == 0 || slices.Contains(f.Types, e.Type)) && !e.Time.Before(f.Since) {
			evs = append(evs, e)
		}
	}
	slices.SortFunc(evs, func(a, b store.EventRow) int {
		if f.Asc {
			return a.Time.Compare(b.Time)
		}
		return b.Time.Compare(a.Time)
	})
	out := []string{}
	for i := f.Offset; i < len(evs) && len(out) < f.Limit; i++ {
		out = append(out, evs[i].Body)
	}
	return out, nil
}

func (m *memStore) GetWebhook(_ context.Context, team, id string) (store.WebhookRow, error) {
	w, ok := m.webhooks[id]
	if !ok || w.TeamID != team {
		return w, fmt.Errorf("webhook %q: %w", id, errdefs.ErrNotFound)
	}
	return w, nil
}

func (m *memStore) CreateWebhook(_ context.Context, w store.WebhookRow, _ int, _ string) error {
	if _, ok := m.webhooks[w.ID]; ok {
		return errors.New("UNIQUE constraint failed: webhooks.id")
	}
	m.webhooks[w.ID] = w
	return nil
}

func (m *memStore) UpdateWebhook(ctx context.Context, w store.WebhookRow) error {
	if _, err := m.GetWebhook(ctx, w.TeamID, w.ID); err != nil {
		return err
	}
	m.webhooks[w.ID] = w
	return nil
}

func (m *memStore) DeleteWebhook(ctx context.Context, team, id string) error {
	if _, err := m.GetWebhook(ctx, team, id); err != nil {
		return err
	}
	delete(m.webhooks, id)
	return nil
}

// event is a stored event of local team teamID.
func event(teamID, sandbox, typ string, at time.Time) store.EventRow {
	e := events.Event{Version: events.Version, ID: fmt.Sprintf("%s-%s-%d", sandbox, typ, at.Unix()), Type: typ, SandboxID: sandbox, SandboxTeamID: teamID, Timestamp: at.UTC()}
	b, _ := json.Marshal(e)
	return store.EventRow{ID: e.ID, TeamID: teamID, SandboxID: sandbox, Type: typ, Time: at, Body: string(b)}
}

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

var secretA = []byte("0123456789abcdef0123456789abcdef")

func TestFeed(t *testing.T) {
	st := &memStore{
		teams: []store.Team{{ID: "local-a", Name: "team-a"}, {ID: "local-b", Name: "team-b"}, {ID: "team-c", Name: "other"}},
		events: []store.EventRow{
			event("local-a", "sa1", events.TypeCreated, t0), event("local-a", "sa1", events.TypeKilled, t0.Add(time.Minute)),
			event("local-b", "sb1", events.TypeCreated, t0), event("team-c", "sc1", events.TypeCreated, t0),
		},
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := Feed(next, secretA, st, quiet)
	good := "Bearer " + FeedToken(secretA)
	for _, tc := range []struct {
		name, method, path, auth string
		want                     int
		ids                      []string // event ids, in order
	}{
		{name: "other paths pass", method: "GET", path: "/sandboxes", want: http.StatusTeapot},
		{name: "no token", method: "GET", path: FeedPath + "?team=team-a&limit=10", want: http.StatusUnauthorized},
		{name: "the secret itself", method: "GET", path: FeedPath + "?team=team-a&limit=10", auth: "Bearer " + string(secretA), want: http.StatusUnauthorized},
		{name: "another secret's token", method: "GET", path: FeedPath + "?team=team-a&limit=10", auth: "Bearer " + FeedToken([]byte("another-secret-another-secret-xx")), want: http.StatusUnauthorized},
		{name: "not GET", method: "POST", path: FeedPath + "?team=team-a&limit=10", auth: good, want: http.StatusBadRequest},
		{name: "team a, newest first", method: "GET", path: FeedPath + "?team=team-a&limit=10", auth: good, want: http.StatusOK,
			ids: []string{st.events[1].ID, st.events[0].ID}},
		{name: "team a, oldest first, one", method: "GET", path: FeedPath + "?team=team-a&limit=1&asc=true", auth: good, want: http.StatusOK,
			ids: []string{st.events[0].ID}},
		{name: "team a, by type", method: "GET", path: FeedPath + "?team=team-a&limit=10&types=" + events.TypeKilled, auth: good, want: http.StatusOK,
			ids: []string{st.events[1].ID}},
		{name: "team a, since", method: "GET", path: FeedPath + fmt.Sprintf("?team=team-a&limit=10&since=%d", t0.Add(time.Second).UnixNano()), auth: good, want: http.StatusOK,
			ids: []string{st.events[1].ID}},
		{name: "team a, another team's sandbox", method: "GET", path: FeedPath + "?team=team-a&limit=10&sandboxID=sb1", auth: good, want: http.StatusOK, ids: []string{}},
		{name: "a team by a local id is no team", method: "GET", path: FeedPath + "?team=local-b&limit=10", auth: good, want: http.StatusOK, ids: []string{}},
		{name: "a team whose name is another's id", method: "GET", path: FeedPath + "?team=team-c&limit=10", auth: good, want: http.StatusOK, ids: []string{}},
		{name: "an unknown team", method: "GET", path: FeedPath + "?team=nobody&limit=10", auth: good, want: http.StatusOK, ids: []string{}},
		{name: "no team", method: "GET", path: FeedPath + "?limit=10", auth: good, want: http.StatusBadRequest},
		{name: "limit too deep", method: "GET", path: FeedPath + fmt.Sprintf("?team=team-a&limit=%d", MaxDepth+1), auth: good, want: http.StatusBadRequest},
		{name: "bad since", method: "GET", path: FeedPath + "?team=team-a&limit=1&since=yesterday", auth: good, want: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.want)
			}
			if tc.ids == nil {
				return
			}
			var got []events.Event
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			ids := []string{}
			for _, e := range got {
				ids = append(ids, e.ID)
				if e.SandboxTeamID != "team-a" {
					t.Errorf("event %s: sandboxTeamId %q, want the cluster's team name", e.ID, e.SandboxTeamID)
				}
			}
			if !slices.Equal(ids, tc.ids) {
				t.Errorf("ids %v, want %v", ids, tc.ids)
			}
		})
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", FeedPath+"?team=team-a&limit=10", nil)
	req.Header.Set("Authorization", "Bearer "+FeedToken(nil))
	Feed(next, nil, st, quiet).ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot {
		t.Errorf("without a token secret the feed is served: %d %s", rec.Code, rec.Body)
	}
}

func scheme(t *testing.T) *fake.ClientBuilder {
	t.Helper()
	s, err := kube.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s)
}

// lease is a node agent's Lease: renewed at renewed, reaching addr.
func lease(node, addr string, renewed time.Time) *coordv1.Lease {
	st, _ := json.Marshal(kube.NodeStatus{Node: node, Address: addr})
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-system", Name: kube.LeasePrefix + node,
		Labels: map[string]string{kube.LabelNodeAgent: "true"}, Annotations: map[string]string{kube.AnnotationNodeStatus: string(st)}}}
	l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
	d := int32(15)
	l.Spec.LeaseDurationSeconds = &d
	return l
}

func TestListEventsMerge(t *testing.T) {
	a := &memStore{teams: []store.Team{{ID: "x1", Name: "team-a"}}, events: []store.EventRow{
		event("x1", "s1", events.TypeCreated, t0), event("x1", "s1", events.TypePaused, t0.Add(2*time.Minute)),
	}}
	b := &memStore{teams: []store.Team{{ID: "y1", Name: "team-a"}, {ID: "y2", Name: "team-b"}}, events: []store.EventRow{
		event("y1", "s1", events.TypeResumed, t0.Add(3*time.Minute)), event("y1", "s2", events.TypeCreated, t0.Add(time.Minute)),
		event("y2", "s9", events.TypeCreated, t0.Add(time.Minute)),
	}}
	srvA := httptest.NewServer(Feed(http.NotFoundHandler(), secretA, a, quiet))
	defer srvA.Close()
	srvB := httptest.NewServer(Feed(http.NotFoundHandler(), secretA, b, quiet))
	defer srvB.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer failing.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	now := time.Now()
	objs := []client.Object{lease("a", host(srvA), now), lease("b", host(srvB), now)}
	gone := lease("gone", "127.0.0.1:1", now.Add(-time.Hour))
	all := []string{"s1/resumed/team-a", "s1/paused/team-a", "s2/created/team-a", "s1/created/team-a"}
	ids := func(bodies []string) []string {
		var out []string
		for _, b := range bodies {
			var e events.Event
			_ = json.Unmarshal([]byte(b), &e)
			out = append(out, e.SandboxID+"/"+strings.TrimPrefix(e.Type, "sandbox.lifecycle.")+"/"+e.SandboxTeamID)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		extra   []client.Object
		only    []client.Object // instead of objs and extra
		f       store.EventFilter
		want    []string
		missing string // the start of the IncompleteError's Missing
		wantErr error
	}{
		{name: "newest first across agents", f: store.EventFilter{TeamID: "team-a", Limit: 10},
			want: []string{"s1/resumed/team-a", "s1/paused/team-a", "s2/created/team-a", "s1/created/team-a"}},
		{name: "oldest first, a page", f: store.EventFilter{TeamID: "team-a", Offset: 1, Limit: 2, Asc: true},
			want: []string{"s2/created/team-a", "s1/paused/team-a"}},
		{name: "one sandbox on two agents", f: store.EventFilter{TeamID: "team-a", SandboxID: "s1", Limit: 10, Asc: true},
			want: []string{"s1/created/team-a", "s1/paused/team-a", "s1/resumed/team-a"}},
		{name: "by type", f: store.EventFilter{TeamID: "team-a", Types: []string{events.TypeCreated}, Limit: 10},
			want: []string{"s2/created/team-a", "s1/created/team-a"}},
		{name: "past the end", f: store.EventFilter{TeamID: "team-a", Offset: 10, Limit: 10}},
		{name: "another team", f: store.EventFilter{TeamID: "team-b", Limit: 10}, want: []string{"s9/created/team-b"}},
		{name: "too deep", f: store.EventFilter{TeamID: "team-a", Offset: MaxDepth, Limit: 10}, wantErr: errdefs.ErrInvalidArgument},
		// Agents that cannot be read: the others' events, and what is missing.
		{name: "a live agent that refuses", extra: []client.Object{lease("c", host(failing), now)}, f: store.EventFilter{TeamID: "team-a", Limit: 10},
			want: all, missing: "1 of 3 node agents not read (1 did not answer)"},
		{name: "a live agent without an address", extra: []client.Object{lease("d", "", now)}, f: store.EventFilter{TeamID: "team-a", Limit: 10},
			want: all, missing: "1 of 3 node agents not read (1 no address on its Lease)"},
		{name: "an agent whose Lease expired", extra: []client.Object{gone}, f: store.EventFilter{TeamID: "team-a", Limit: 10, Since: t0.Add(-time.Hour)},
			want: all, missing: "1 of 3 node agents not read (1 Lease expired)"},
		{name: "all three", extra: []client.Object{gone, lease("c", host(failing), now), lease("d", "", now)}, f: store.EventFilter{TeamID: "team-a", Limit: 1, Offset: 1},
			want: all[1:2], missing: "3 of 5 node agents not read (1 Lease expired, 1 did not answer, 1 no address on its Lease)"},
		// (The events here are older than that too: none is served.)
		{name: "a Lease expired before the events kept", extra: []client.Object{gone}, f: store.EventFilter{TeamID: "team-a", Limit: 10, Since: now.Add(-time.Minute)}},
		{name: "no agent can be read", only: []client.Object{gone, lease("c", host(failing), now)}, f: store.EventFilter{TeamID: "team-a", Limit: 10},
			wantErr: errdefs.ErrUnavailable},
		{name: "no agent at all", only: []client.Object{}, f: store.EventFilter{TeamID: "team-a", Limit: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := append(slices.Clone(objs), tc.extra...)
			if tc.only != nil {
				o = tc.only
			}
			c := scheme(t).WithObjects(o...).Build()
			st := NewStore(c, "agentbox-webhooks", "agentbox-system", secretA, quiet)
			got, err := st.ListEvents(t.Context(), tc.f)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				return
			}
			var inc *events.IncompleteError
			switch {
			case tc.missing == "" && err != nil:
				t.Fatal(err)
			case tc.missing != "" && !errors.As(err, &inc):
				t.Fatalf("err %v, want the events of the agents read and what is missing", err)
			case tc.missing != "" && !strings.HasPrefix(inc.Missing, tc.missing):
				t.Errorf("missing %q, want %q...", inc.Missing, tc.missing)
			}
			if g := ids(got); !slices.Equal(g, tc.want) {
				t.Errorf("got %v, want %v", g, tc.want)
			}
		})
	}
}

func TestWebhookSecrets(t *testing.T) {
	ctx := t.Context()
	c := scheme(t).Build()
	st := NewStore(c, "agentbox-webhooks", "agentbox-system", secretA, quiet)
	w := store.WebhookRow{ID: "0c6d7e3a-1111-4222-8333-944445555666", TeamID: "team-a", Name: "n", URL: "https://hooks.example.com/x",
		Enabled: true, Events: []string{events.TypeCreated}, Secret: "s3cret-s3cret", CreatedAt: t0}
	if err := st.CreateWebhook(ctx, w, 1, "--max-webhooks"); err != nil {
		t.Fatal(err)
	}
	w2 := w
	w2.ID = "1c6d7e3a-1111-4222-8333-944445555666"
	if err := st.CreateWebhook(ctx, w2, 1, "--max-webhooks"); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "--max-webhooks") {
		t.Errorf("second webhook past a bound of 1: %v", err)
	}
	w2.TeamID = "team-b"
	if err := st.CreateWebhook(ctx, w2, 1, "--max-webhooks"); err != nil {
		t.Errorf("the other team's first webhook: %v", err)
	}
	for _, tc := range []struct {
		name, team, id string
		found          bool
	}{
		{"own", "team-a", w.ID, true},
		{"foreign", "team-b", w.ID, false},
		{"missing", "team-a", "2c6d7e3a-1111-4222-8333-944445555666", false},
		{"odd id", "team-a", "../../api-keys/x", false},
		{"upper case id", "team-a", strings.ToUpper(w.ID), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := st.GetWebhook(ctx, tc.team, tc.id)
			if !tc.found {
				if !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("get: %v, want not found", err)
				}
				if err := st.DeleteWebhook(ctx, tc.team, tc.id); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("delete: %v, want not found", err)
				}
				u := w
				u.TeamID, u.ID, u.Name = tc.team, tc.id, "stolen"
				if err := st.UpdateWebhook(ctx, u); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("update: %v, want not found", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Secret != w.Secret || got.URL != w.URL || !got.CreatedAt.Equal(w.CreatedAt) || !slices.Equal(got.Events, w.Events) {
				t.Errorf("got %+v, want %+v", got, w)
			}
		})
	}
	if l, err := st.ListWebhooks(ctx, "team-a"); err != nil || len(l) != 1 || l[0].ID != w.ID {
		t.Errorf("list team-a: %+v %v", l, err)
	}
	u := w
	u.Name, u.Enabled, u.Events = "renamed", false, []string{events.TypeKilled}
	if err := st.UpdateWebhook(ctx, u); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetWebhook(ctx, "team-a", w.ID); got.Name != "renamed" || got.Enabled || !slices.Equal(got.Events, u.Events) {
		t.Errorf("after update: %+v", got)
	}
	if err := st.DeleteWebhook(ctx, "team-a", w.ID); err != nil {
		t.Fatal(err)
	}
	if l, _ := st.ListWebhooks(ctx, "team-a"); len(l) != 0 {
		t.Errorf("after delete: %+v", l)
	}
	// An API key Secret is never a webhook.
	key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-webhooks", Name: SecretPrefix + "k1",
		Labels: map[string]string{kube.LabelTeam: "team-a", LabelWebhookID: "k1"}}, Type: "agentbox.dev/api-key"}
	if err := c.Create(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetWebhook(ctx, "team-a", "k1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an API key Secret read as a webhook: %v", err)
	}
}

func TestMirror(t *testing.T) {
	ctx := t.Context()
	c := scheme(t).Build()
	api := NewStore(c, "agentbox-webhooks", "agentbox-system", secretA, quiet)
	hook := func(id, team string) store.WebhookRow {
		return store.WebhookRow{ID: id, TeamID: team, URL: "https://hooks.example.com/" + id, Enabled: true,
			Events: []string{events.TypeCreated}, Secret: "secret-" + id, CreatedAt: t0}
	}
	for _, w := range []store.WebhookRow{hook("h1", "team-a"), hook("h2", "team-b"), hook("h3", "nowhere"), hook("h4", "local-a")} {
		if err := api.CreateWebhook(ctx, w, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	local := &memStore{teams: []store.Team{{ID: "local-a", Name: "team-a"}, {ID: "local-b", Name: "team-b"}},
		webhooks: map[string]store.WebhookRow{"own": hook("own", "local-a")}}
	state := filepath.Join(t.TempDir(), "kube-webhooks.json")
	sync := func() {
		t.Helper()
		if err := NewMirror(c, "agentbox-webhooks", local, state, quiet).Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	has := func() []string {
		var ids []string
		for id, w := range local.webhooks {
			ids = append(ids, id+"@"+w.TeamID)
		}
		slices.Sort(ids)
		return ids
	}
	sync()
	// h3's team never ran here; h4 names a team by a local id.
	if got, want := has(), []string{"h1@local-a", "h2@local-b", "own@local-a"}; !slices.Equal(got, want) {
		t.Fatalf("after the first sync: %v, want %v", got, want)
	}
	u := hook("h1", "team-a")
	u.Secret, u.Enabled = "rotated-secret", false
	if err := api.UpdateWebhook(ctx, u); err != nil {
		t.Fatal(err)
	}
	if err := api.DeleteWebhook(ctx, "team-b", "h2"); err != nil {
		t.Fatal(err)
	}
	sync() // a new mirror: what it added is read back from the state file
	if got, want := has(), []string{"h1@local-a", "own@local-a"}; !slices.Equal(got, want) {
		t.Fatalf("after the delete: %v, want %v (the agent's own webhook stays)", got, want)
	}
	if w := local.webhooks["h1"]; w.Secret != "rotated-secret" || w.Enabled {
		t.Errorf("h1 not updated: %+v", w)
	}
	// A team moved under a webhook: removed from the old team, then added
	// to the new one.
	var sec corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "agentbox-webhooks", Name: SecretPrefix + "h1"}, &sec); err != nil {
		t.Fatal(err)
	}
	sec.Labels[kube.LabelTeam] = "team-b"
	if err := c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	sync()
	sync()
	if got, want := has(), []string{"h1@local-b", "own@local-a"}; !slices.Equal(got, want) {
		t.Fatalf("after the team changed: %v, want %v", got, want)
	}
}

// TestWebhookFigures: the API tier reports a cluster webhook's owed and
// dropped deliveries and last error as the node agents that deliver it
// count them, summed, and only for the caller's team's webhooks.
func TestWebhookFigures(t *testing.T) {
	ctx := t.Context()
	const id = "0c6d7e3a-1111-4222-8333-944445555666"
	a := &memStore{teams: []store.Team{{ID: "x1", Name: "team-a"}}, pending: map[string]int{id: 2, "own": 7},
		webhooks: map[string]store.WebhookRow{id: {ID: id, TeamID: "x1", Dropped: 1}, "own": {ID: "own", TeamID: "x1", Dropped: 9}}}
	b := &memStore{teams: []store.Team{{ID: "y1", Name: "team-a"}}, pending: map[string]int{id: 3},
		webhooks: map[string]store.WebhookRow{id: {ID: id, TeamID: "y1", Dropped: 4, LastError: "receiver answered 500"}}}
	srvA := httptest.NewServer(Feed(http.NotFoundHandler(), secretA, a, quiet))
	defer srvA.Close()
	srvB := httptest.NewServer(Feed(http.NotFoundHandler(), secretA, b, quiet))
	defer srvB.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	defer failing.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	now := time.Now()
	c := scheme(t).WithObjects(lease("a", host(srvA), now), lease("b", host(srvB), now), lease("c", host(failing), now)).Build()
	st := NewStore(c, "agentbox-webhooks", "agentbox-system", secretA, quiet)
	w := store.WebhookRow{ID: id, TeamID: "team-a", URL: "https://hooks.example.com/x", Enabled: true,
		Events: []string{events.TypeCreated}, Secret: "s3cret-s3cret", CreatedAt: t0}
	if err := st.CreateWebhook(ctx, w, 0, ""); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.PendingDeliveries(ctx, id); n != 0 {
		t.Errorf("pending before the webhook was read: %d, want 0", n)
	}
	got, err := st.GetWebhook(ctx, "team-a", id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Dropped != 5 || got.LastError != "node b: receiver answered 500" {
		t.Errorf("dropped %d, last error %q; want 5 and node b's", got.Dropped, got.LastError)
	}
	if n, _ := st.PendingDeliveries(ctx, id); n != 5 {
		t.Errorf("pending %d, want 2+3 (the agent that failed adds nothing)", n)
	}
	list, err := st.ListWebhooks(ctx, "team-a")
	if err != nil || len(list) != 1 || list[0].Dropped != 5 {
		t.Errorf("list: %+v %v, want the one webhook, 5 dropped", list, err)
	}
	if n, _ := st.PendingDeliveries(ctx, "own"); n != 0 {
		t.Errorf("an agent's own webhook counted on the cluster tier: %d", n)
	}
	if l, _ := st.ListWebhooks(ctx, "team-b"); len(l) != 0 {
		t.Errorf("team B lists %+v", l)
	}
	// The agents' route answers only the replicas' token.
	req := httptest.NewRequest("GET", StatsPath+"?team=team-a", nil)
	rec := httptest.NewRecorder()
	Feed(http.NotFoundHandler(), secretA, a, quiet).ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("stats without a token: %d %s", rec.Code, rec.Body)
	}
}
