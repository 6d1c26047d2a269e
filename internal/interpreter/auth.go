package interpreter

import (
	"context"
	"crypto/subtle"
	"io"
	"net/http"
	"sync"
	"time"
)

// tokenCache checks /execute's X-Access-Token the way E2B's interpreter
// does: envd, which holds the sandbox's token, judges it (GET /envs answers
// 401 to a wrong token and 200 to any in a sandbox without one). A token
// envd accepted is remembered, since a sandbox's token never changes.
type tokenCache struct {
	mu   sync.Mutex
	good []string
}

var envdClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}

func (c *tokenCache) check(ctx context.Context, envdURL, token string) (int, string) {
	c.mu.Lock()
	for _, g := range c.good {
		if subtle.ConstantTimeCompare([]byte(g), []byte(token)) == 1 {
			c.mu.Unlock()
			return http.StatusOK, ""
		}
	}
	c.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, envdURL+"/envs", nil)
	if err != nil {
		return http.StatusInternalServerError, err.Error()
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := envdClient.Do(req)
	if err != nil {
		return http.StatusServiceUnavailable, "cannot verify the access token with envd: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch {
	case resp.StatusCode == http.StatusOK:
		c.mu.Lock()
		if len(c.good) < 8 {
			c.good = append(c.good, token)
		}
		c.mu.Unlock()
		return http.StatusOK, ""
	case resp.StatusCode == http.StatusUnauthorized:
		return http.StatusUnauthorized, "unauthorized: /execute needs the sandbox's access token in X-Access-Token"
	}
	return http.StatusServiceUnavailable, "cannot verify the access token with envd: " + resp.Status
}
