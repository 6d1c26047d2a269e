package agentbox

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestSandboxEventsPageIncomplete(t *testing.T) {
	for _, tc := range []struct {
		name, header string
	}{
		{"whole answer", ""},
		{"an agent missing", "1 of 2 node agents not read (1 Lease expired)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/events/sandboxes/sb1" {
					t.Errorf("path %q", r.URL.Path)
				}
				if tc.header != "" {
					w.Header().Set(IncompleteHeader, tc.header)
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`[{"id":"e1","type":"sandbox.lifecycle.created","sandboxId":"sb1"}]`))
			}))
			defer srv.Close()
			p, err := New(WithAPIURL(srv.URL)).SandboxEventsPage(context.Background(), "sb1", EventsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Events) != 1 || p.Events[0].ID != "e1" {
				t.Errorf("events %+v", p.Events)
			}
			if p.Incomplete != tc.header {
				t.Errorf("incomplete %q, want %q", p.Incomplete, tc.header)
			}
		})
	}
}
