package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// A sandbox created with maxCommandSeconds has every command killed at
// that cap, even one started with no timeout, and the error says why; a
// cap above the server's is refused up front.
func TestMaxCommandLifetime(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	create := func(body string) (*http.Response, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/sandboxes", bytes.NewBufferString(body))
		req.Header.Set("X-API-Key", s.APIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp, out
	}
	if resp, out := create(`{"templateID":"base","maxCommandSeconds":99999999}`); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(out["message"].(string), "maximum command lifetime") {
		t.Fatalf("cap above the server's: %d %v", resp.StatusCode, out)
	}
	resp, out := create(`{"templateID":"base","timeout":300,"maxCommandSeconds":2}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", resp.StatusCode, out)
	}
	id := out["sandboxID"].(string)
	c := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
	sbx, err := c.Connect(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sbx.Kill(context.Background()) }()

	if res, err := sbx.Commands.Run(ctx, "echo quick"); err != nil || res.Stdout != "quick\n" {
		t.Fatalf("short command: %+v, %v", res, err)
	}
	_, err = sbx.Commands.Run(ctx, "sleep 600", agentbox.WithTimeout(0))
	// The SDK reports the end event (exit -1 with envd's reason) or the
	// stream's deadline_exceeded, whichever it reads first; both name the cap.
	if err == nil || !strings.Contains(err.Error(), "maximum command lifetime of 2s") {
		t.Fatalf("long command: err = %v, want an error naming the cap", err)
	}
}
