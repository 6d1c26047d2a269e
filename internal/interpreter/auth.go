package interpreter

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"
)

// /execute runs code, so it needs the sandbox's access token in
// X-Access-Token. The context routes (create, list, restart, delete) are
// served, as by E2B's interpreter and for its SDKs, which send no token
// there, to whoever reaches the port: like every port of the sandbox, they
// are public unless the sandbox was created with allowPublicTraffic=false,
// when the gateway asks a traffic token first. A token sent on any route
// must be the right one, so a wrong one is refused and counted as a guess.
// envd, which holds the token, judges it (GET /auth answers 204 to the
// right token, and to any in a sandbox created without one). Nothing is
// remembered: a fork or restore gets a new token from /init, and the old
// one must stop working at once.

var envdClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}

// requireToken wraps next with the token check when envdURL is set.
func requireToken(envdURL string, next http.Handler) http.Handler {
	if envdURL == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		if contextRoute(r.URL.Path) && len(r.Header.Values("X-Access-Token")) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if code, msg := checkToken(r.Context(), envdURL, r.Header.Values("X-Access-Token")); code != http.StatusOK {
			w.Header().Set("Cache-Control", "no-store")
			http.Error(w, msg, code)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// contextRoute reports whether path is one of the context routes.
func contextRoute(path string) bool {
	return path == "/contexts" || strings.HasPrefix(path, "/contexts/")
}

func checkToken(ctx context.Context, envdURL string, tokens []string) (int, string) {
	const need = "unauthorized: this sandbox's code interpreter runs code only with the sandbox's access token (envdAccessToken) in one X-Access-Token header, and refuses a wrong one on every route"
	if len(tokens) > 1 {
		return http.StatusUnauthorized, need
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, envdURL+"/auth", nil)
	if err != nil {
		return http.StatusInternalServerError, err.Error()
	}
	if len(tokens) == 1 && tokens[0] != "" {
		req.Header.Set("X-Access-Token", tokens[0])
	}
	resp, err := envdClient.Do(req)
	if err != nil {
		return http.StatusServiceUnavailable, "cannot verify the access token with envd: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		return http.StatusOK, ""
	case http.StatusUnauthorized:
		return http.StatusUnauthorized, need
	}
	return http.StatusServiceUnavailable, "cannot verify the access token with envd: " + resp.Status
}
