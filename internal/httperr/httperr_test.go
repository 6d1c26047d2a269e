package httperr

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Errors reach clients as E2B's {code, message} with the status their
// sentinel maps to, and without the sentinel's text.
func TestWrite(t *testing.T) {
	tests := []struct {
		err        error
		wantStatus int
		wantMsg    string
	}{
		{fmt.Errorf("maxSandboxes: the team already has 2: %w", errdefs.ErrResourceExhausted), http.StatusTooManyRequests, "maxSandboxes: the team already has 2"},
		{fmt.Errorf("memoryMB: over the team quota: %w", errdefs.ErrInvalidArgument), http.StatusBadRequest, "memoryMB: over the team quota"},
		{fmt.Errorf("boom"), http.StatusInternalServerError, "boom"},
		// Server-side failures never show host paths (attacker: any API client).
		{fmt.Errorf("sandbox i1: pause: runc checkpoint: criu failed: log file: /var/lib/agentbox/sandboxes/0a1b/criu-work/dump.log (criu: Error (criu/cr-dump.c:1685): Timeout)"),
			http.StatusInternalServerError, "sandbox i1: pause: runc checkpoint: criu failed: log file: <server path> (criu: Error (criu/cr-dump.c:1685): Timeout)"},
		{fmt.Errorf("sandbox i1: resume: open /tmp/x/data/snapshots/abc/img: no such file: %w", errdefs.ErrUnavailable), http.StatusServiceUnavailable,
			"sandbox i1: resume: open <server path>: no such file"},
		// A client's own path in a 4xx stays: it is what they sent.
		{fmt.Errorf("volumeMounts[0].path: /proc/sys is reserved: %w", errdefs.ErrInvalidArgument), http.StatusBadRequest, "volumeMounts[0].path: /proc/sys is reserved"},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		Write(w, tt.err)
		var body rest.Error
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", tt.err, w.Body, err)
		}
		if w.Code != tt.wantStatus || body.Code != tt.wantStatus || body.Message != tt.wantMsg {
			t.Errorf("%v: %d %+v; want %d %q", tt.err, w.Code, body, tt.wantStatus, tt.wantMsg)
		}
	}
}
