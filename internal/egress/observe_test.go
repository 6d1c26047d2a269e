package egress

import "testing"

// The reason label is a fixed class: a rule's text (tenant domain names)
// never becomes a label value.
func TestReasonClass(t *testing.T) {
	for _, tc := range []struct {
		rule, err, want string
	}{
		{"allowOut api.tenant-secret-name.example", "", "allow_out"},
		{"denyOut 10.1.2.0/24", "", "deny_out"},
		{"default: internet access denied (allow_internet_access false)", "", "default"},
		{"limit: 64 concurrent connections per sandbox", "", "limit"},
		{"allowOut example.com", "dial tcp: i/o timeout", "error"},
		{`Host header "a" differs from the TLS server name "b"`, "", "other"},
		{"", "", "other"},
	} {
		if got := reasonClass(&connEvent{rule: tc.rule, err: tc.err}); got != tc.want {
			t.Errorf("rule %q err %q: %q, want %q", tc.rule, tc.err, got, tc.want)
		}
	}
}
