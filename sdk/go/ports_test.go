package agentbox

import "testing"

func TestPortURL(t *testing.T) {
	t.Setenv("AGENTBOX_DOMAIN", "")
	t.Setenv("E2B_DOMAIN", "")
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"localhost with the data plane's port", []Option{WithAPIURL("http://127.0.0.1:3000")}, "http://8000-iabc.localhost:3000/"},
		{"a separate data plane", []Option{WithAPIURL("http://127.0.0.1:3000"), WithSandboxURL("http://127.0.0.1:3002")}, "http://8000-iabc.localhost:3002/"},
		{"the server's domain", []Option{WithAPIURL("https://api.example.com"), WithDomain("sbx.example.com")}, "https://8000-iabc.sbx.example.com/"},
		{"a domain with a port (E2B_DOMAIN=localhost:3000)", []Option{WithAPIURL("http://127.0.0.1:3000"), WithDomain("localhost:3000")}, "http://8000-iabc.localhost:3000/"},
	} {
		s := &Sandbox{ID: "iabc", client: New(tc.opts...)}
		if got := s.PortURL(8000); got != tc.want {
			t.Errorf("%s: PortURL = %q, want %q", tc.name, got, tc.want)
		}
	}
}
