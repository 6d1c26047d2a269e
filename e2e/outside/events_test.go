package outside

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestEventsAttacks: another tenant against a team's lifecycle events and
// webhooks, and a tenant using a webhook to make the server reach what it
// must not (loopback, metadata, its own API).
func TestEventsAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)
	// Team A's events exist before B looks for them.
	eventsWaitUntil(t, "team A's created event", func() bool { return strings.Contains(eventsOf(ctx, t, s, s.APIKey, "/events/sandboxes/"+id), id) })
	// Team A's webhook, disabled so nothing is ever sent to it; the
	// address is the suite's allowed registry (registration checks it).
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/events/webhooks", map[string]any{"name": "a", "url": "http://" + allowedRegistry.Addr().String() + "/hook",
		"enabled": false, "events": []string{"sandbox.lifecycle.created"}, "signatureSecret": "team-a-secret-123"})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("team A registers a webhook: %d %s %v", st, b, err)
	}
	hook := jsonField(t, b, "id")
	t.Cleanup(func() { s.Do(context.Background(), s.APIKey, http.MethodDelete, "/events/webhooks/"+hook, nil) })
	hookOf := func(key string) (int, string) {
		st, b, _ := s.Do(ctx, key, http.MethodGet, "/events/webhooks/"+hook, nil)
		return st, string(b)
	}

	runAttacks(t, []attack{
		{side: sideTenant, name: "other team GET /events/sandboxes/{id} of a team's sandbox", run: func(t *testing.T) error {
			if b := eventsOf(ctx, t, s, s.OtherKey, "/events/sandboxes/"+id+"?limit=100"); strings.Contains(b, id) {
				return crossed("got team A's events: %.120s", b)
			}
			return nil
		}},
		{side: sideTenant, name: "other team GET /events/sandboxes sees a team's events", run: func(t *testing.T) error {
			if b := eventsOf(ctx, t, s, s.OtherKey, "/events/sandboxes?limit=100&orderAsc=true"); strings.Contains(b, id) {
				return crossed("got team A's events: %.120s", b)
			}
			return nil
		}},
		{side: sideTenant, name: "other team GET /events/webhooks/{id} and the list", run: func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/events/webhooks/"+hook, nil)
			if err != nil {
				return err
			}
			if st != http.StatusNotFound {
				return crossed("GET: %d %.120s", st, b)
			}
			_, b, _ = s.Do(ctx, s.OtherKey, http.MethodGet, "/events/webhooks", nil)
			if strings.Contains(string(b), hook) {
				return crossed("listed: %.120s", b)
			}
			return nil
		}},
		{side: sideTenant, name: "other team PATCH /events/webhooks/{id} (redirects a team's deliveries)", run: func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPatch, "/events/webhooks/"+hook, map[string]any{"url": "http://" + allowedRegistry.Addr().String() + "/stolen", "enabled": true})
			if err != nil {
				return err
			}
			if _, after := hookOf(s.APIKey); st != http.StatusNotFound || strings.Contains(after, "stolen") {
				return crossed("PATCH answered %d %.80s; team A's webhook now %.120s", st, b, after)
			}
			return nil
		}},
		{side: sideTenant, name: "other team DELETE /events/webhooks/{id}", run: func(t *testing.T) error {
			st, _, err := s.Do(ctx, s.OtherKey, http.MethodDelete, "/events/webhooks/"+hook, nil)
			if err != nil {
				return err
			}
			if still, _ := hookOf(s.APIKey); st != http.StatusNotFound || still != http.StatusOK {
				return crossed("DELETE answered %d; team A's webhook now answers %d", st, still)
			}
			return nil
		}},
	})

	// A webhook is a fetch the server makes for a tenant: the destination
	// policy closes loopback, link-local (metadata), the host's own
	// addresses and the server's own API, at registration and at connect.
	svc := startInternalService(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(svc.addr)
	// loopback: the target is the loopback service, whose counter tells.
	type target struct {
		name, url string
		loopback  bool
	}
	targets := []target{
		{"webhook to a loopback service (127.0.0.1)", "http://" + svc.addr + "/hook", true},
		{"webhook to a loopback service by name (localhost)", "http://localhost:" + port + "/hook", true},
		{"webhook to the cloud metadata address (169.254.169.254)", "http://169.254.169.254/latest/meta-data/", false},
		{"webhook to the server's own API", s.URL + "/sandboxes", false},
	}
	registered := map[string]string{} // target name → webhook id
	refusal := map[string]string{}
	for _, tg := range targets {
		st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/events/webhooks", map[string]any{"url": tg.url, "enabled": true,
			"events": []string{"sandbox.lifecycle.created", "sandbox.lifecycle.killed"}, "signatureSecret": "team-b-secret-123"})
		switch {
		case err != nil:
			refusal[tg.name] = "error: " + err.Error()
		case st == http.StatusCreated:
			registered[tg.name] = jsonField(t, b, "id")
		default:
			refusal[tg.name] = fmt.Sprintf("%d %s", st, b)
		}
	}
	for _, hid := range registered {
		t.Cleanup(func() { s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/events/webhooks/"+hid, nil) })
	}
	// Team B makes events its webhooks are owed, then each registered
	// webhook is watched until nothing is owed to it any more.
	if len(registered) > 0 {
		st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120})
		if err != nil || st != http.StatusCreated {
			t.Fatalf("team B creates a sandbox: %d %s %v", st, b, err)
		}
		bid := jsonField(t, b, "sandboxID")
		s.Do(ctx, s.OtherKey, http.MethodDelete, "/sandboxes/"+bid, nil)
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hid, ok := registered[tg.name]
			if !ok {
				if !strings.Contains(refusal[tg.name], "400") {
					record(t, sideTenant, tg.name, fmt.Errorf("registration failed unexpectedly: %s", refusal[tg.name]))
					return
				}
				blockedBecause(t, sideTenant, tg.name, "refused at registration: "+refusal[tg.name])
				return
			}
			var last struct {
				PendingDeliveries int
				LastError         string
			}
			deadline := time.Now().Add(60 * time.Second)
			for {
				_, b, _ := s.Do(ctx, s.OtherKey, http.MethodGet, "/events/webhooks/"+hid, nil)
				_ = json.Unmarshal(b, &last)
				if last.PendingDeliveries == 0 && last.LastError != "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			switch {
			case tg.loopback && svc.reached() > 0:
				record(t, sideTenant, tg.name, crossed("the loopback service got %d connections/requests", svc.reached()))
			case strings.Contains(last.LastError, "refused"):
				blockedBecause(t, sideTenant, tg.name, "registered but never delivered: "+last.LastError)
			default:
				record(t, sideTenant, tg.name, crossed("registered, and the server kept trying to deliver (pending %d, last error %q)", last.PendingDeliveries, last.LastError))
			}
		})
	}
}

// eventsOf GETs an events path with key and returns the body (200 only).
func eventsOf(ctx context.Context, t *testing.T, s *target, key, path string) string {
	t.Helper()
	st, b, err := s.Do(ctx, key, http.MethodGet, path, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("GET %s: %d %s %v", path, st, b, err)
	}
	return string(b)
}

func eventsWaitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
