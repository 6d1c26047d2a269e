package dashboard

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	h := Handler()
	tests := []struct {
		path, wantType string
		wantStatus     int
	}{
		{"/dashboard/", "text/html", http.StatusOK},
		{"/dashboard/app.js", "text/javascript", http.StatusOK},
		{"/dashboard/app.css", "text/css", http.StatusOK},
		{"/dashboard/nope.js", "", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tt.wantType) {
				t.Errorf("Content-Type %q, want %q", ct, tt.wantType)
			}
			// Every answer, a 404 too, carries the policy.
			for k, want := range map[string]string{"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cross-Origin-Opener-Policy": "same-origin"} {
				if got := rec.Header().Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// The page must work under its own policy: no inline script, no inline
// event handler.
func TestIndexHasNoInlineScript(t *testing.T) {
	b, err := dist.ReadFile("dist/index.html")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, tag := range regexp.MustCompile(`(?is)<script[^>]*>.*?</script>`).FindAllString(page, -1) {
		if !strings.Contains(tag, ` src="`) || !strings.HasSuffix(tag, "></script>") {
			t.Errorf("inline script: %s", tag)
		}
	}
	if m := regexp.MustCompile(`(?i)\son[a-z]+=`).FindString(page); m != "" {
		t.Errorf("inline event handler %q", m)
	}
	for _, d := range []string{"script-src 'self'", "frame-ancestors 'none'", "connect-src 'self'"} {
		if !strings.Contains(CSP, d) {
			t.Errorf("CSP lacks %q", d)
		}
	}
	if strings.Contains(CSP, "'unsafe-eval'") || strings.Contains(strings.SplitN(strings.SplitN(CSP, "script-src", 2)[1], ";", 2)[0], "unsafe-inline") {
		t.Errorf("CSP allows inline or eval'd scripts: %s", CSP)
	}
}
