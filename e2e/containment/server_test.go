package containment

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/agentbox/agentbox/e2e/harness"
)

// server is the agentbox server the attacks run against: one the harness
// starts on its own instance, bridge and subnet, or an already running one
// named by CONTAINMENT_API_URL, _API_KEY, _DATA_DIR, _INSTANCE.
type server struct {
	url      string
	key      string
	dataDir  string
	instance string
}

func startServer(t *testing.T) *server {
	t.Helper()
	if u := os.Getenv("CONTAINMENT_API_URL"); u != "" {
		return &server{url: u, key: os.Getenv("CONTAINMENT_API_KEY"), dataDir: os.Getenv("CONTAINMENT_DATA_DIR"),
			instance: os.Getenv("CONTAINMENT_INSTANCE")}
	}
	s := harness.Start(t, harness.Args("--health-interval", "5s"))
	return &server{url: s.URL, key: s.APIKey, dataDir: s.DataDir, instance: s.Instance}
}

// api calls the control plane and decodes a JSON answer into out.
func (s *server) api(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}
