package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSameOrigin(t *testing.T) {
	tests := []struct {
		host, origin string
		want         bool
	}{
		{"127.0.0.1:3000", "", true}, // not a browser
		{"127.0.0.1:3000", "http://127.0.0.1:3000", true},
		{"box.example:443", "https://box.example:443", true},
		{"Box.Example", "https://box.example", true},
		{"127.0.0.1:3000", "http://127.0.0.1:3001", false},
		{"127.0.0.1:3000", "http://evil.example", false},
		{"127.0.0.1:3000", "null", false},
		{"127.0.0.1:3000", "file://127.0.0.1:3000", false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/dashboard/api/sandboxes/x/terminal", nil)
		r.Host = tt.host
		if tt.origin != "" {
			r.Header.Set("Origin", tt.origin)
		}
		if got := sameOrigin(r); got != tt.want {
			t.Errorf("host %q origin %q: %v, want %v", tt.host, tt.origin, got, tt.want)
		}
	}
}

func TestProtocolKey(t *testing.T) {
	tests := []struct {
		header []string
		want   string
	}{
		{nil, ""},
		{[]string{"agentbox.terminal"}, ""},
		{[]string{"agentbox.terminal, agentbox.key.e2b_abc"}, "e2b_abc"},
		{[]string{"agentbox.terminal", "agentbox.key.e2b_def"}, "e2b_def"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, h := range tt.header {
			r.Header.Add("Sec-WebSocket-Protocol", h)
		}
		if got := protocolKey(r); got != tt.want {
			t.Errorf("%q: %q, want %q", tt.header, got, tt.want)
		}
	}
}

// The page learns where ports are served from the server: the gateway's
// word when it gave one, else localhost (each port its own origin).
func TestDashConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		origin func(*http.Request) (string, string)
		want   string
	}{
		{"no gateway", nil, `{"portDomain":"localhost:3000","portScheme":"http"}`},
		{"the gateway's word", func(*http.Request) (string, string) { return "https", "sbx.example.com:8443" }, `{"portDomain":"sbx.example.com:8443","portScheme":"https"}`},
	} {
		s := &Server{}
		s.SetPortOrigin(tc.origin)
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/dashboard/api/config", nil)
		r.Host = "127.0.0.1:3000"
		s.dashConfig(w, r)
		if got := strings.TrimSpace(w.Body.String()); w.Code != http.StatusOK || got != tc.want {
			t.Errorf("%s: %d %s, want %s", tc.name, w.Code, got, tc.want)
		}
	}
}
