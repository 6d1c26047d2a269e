package sandbox

import (
	"maps"
	"testing"
)

// withCA is a Network whose egress proxy has per-sandbox CAs; only
// EgressCA is used by envdLink.env.
type withCA struct{ Network }

func (withCA) EgressCA(string) ([]byte, error) { return nil, nil }

func TestEnvdEnv(t *testing.T) {
	rules := &NetworkSpec{Rules: map[string][]NetworkRule{"api.example.com": {{}}}}
	ca := caEnv()
	withUser := caEnv()
	withUser["FOO"] = "bar"
	withUser["SSL_CERT_FILE"] = "/mine.pem"
	for _, tc := range []struct {
		name string
		net  Network
		sb   Sandbox
		want map[string]string
	}{
		{"no rules", withCA{}, Sandbox{EnvVars: map[string]string{"FOO": "bar"}}, map[string]string{"FOO": "bar"}},
		{"empty rules", withCA{}, Sandbox{Network: &NetworkSpec{}}, nil},
		{"rules", withCA{}, Sandbox{Network: rules}, ca},
		{"rules, the user's values win", withCA{}, Sandbox{Network: rules, EnvVars: map[string]string{"FOO": "bar", "SSL_CERT_FILE": "/mine.pem"}}, withUser},
		{"rules but no egress proxy", nil, Sandbox{Network: rules}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &envdLink{net: tc.net}
			if got := e.env(&tc.sb); !maps.Equal(got, tc.want) {
				t.Errorf("env = %v, want %v", got, tc.want)
			}
		})
	}
}
