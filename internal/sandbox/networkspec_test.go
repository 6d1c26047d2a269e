package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestRuleSpec(t *testing.T) {
	headers := func(plain bool) []NetworkRule {
		r := NetworkRule{AllowPlainHTTP: plain}
		r.Transform = &struct {
			Headers map[string]string `json:"headers,omitempty"`
		}{Headers: map[string]string{"Authorization": "Bearer x"}}
		return []NetworkRule{r}
	}
	for _, tc := range []struct {
		name    string
		rules   map[string][]NetworkRule
		wantErr string
		plain   bool
	}{
		{name: "HTTPS only by default", rules: map[string][]NetworkRule{"api.example.com": headers(false)}},
		{name: "plain HTTP opted in", rules: map[string][]NetworkRule{"api.example.com": headers(true)}, plain: true},
		{name: "an address is not a rule domain", rules: map[string][]NetworkRule{"1.2.3.4": headers(false)}, wantErr: `network.rules["1.2.3.4"]`},
		{name: "allowPlainHTTP without headers", rules: map[string][]NetworkRule{"api.example.com": {{AllowPlainHTTP: true}}}, wantErr: "allowPlainHTTP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policies{}.policy(context.Background(), "team", "", true, &NetworkSpec{Rules: tc.rules})
			if tc.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want InvalidArgument naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.InjectFor("api.example.com", false); (len(got) > 0) != tc.plain {
				t.Errorf("plain-HTTP transforms %v, want present=%v", got, tc.plain)
			}
			if got := p.InjectFor("api.example.com", true); len(got) != 1 {
				t.Errorf("TLS transforms %v, want 1", got)
			}
		})
	}
}
