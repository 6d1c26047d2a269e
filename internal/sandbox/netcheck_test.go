package sandbox

import (
	"errors"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TestCheckNetworkSpec: the cluster API tier validates network settings
// with no manager at all; it answers as the manager does.
func TestCheckNetworkSpec(t *testing.T) {
	tests := []struct {
		name    string
		n       *NetworkSpec
		wantErr bool
	}{
		{"none", nil, false},
		{"allow a domain", &NetworkSpec{AllowOut: []string{"example.com"}, DenyOut: []string{"ALL_TRAFFIC"}}, false},
		{"domains without deny-all", &NetworkSpec{AllowOut: []string{"example.com"}}, true},
		{"bad entry", &NetworkSpec{AllowOut: []string{"not a domain!"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckNetworkSpec(t.Context(), true, tt.n)
			if (err != nil) != tt.wantErr {
				t.Fatalf("CheckNetworkSpec: %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v is not an invalid argument", err)
			}
			var m *Manager
			if merr := m.CheckNetwork(t.Context(), "", true, tt.n); (merr != nil) != (err != nil) {
				t.Errorf("CheckNetwork: %v, CheckNetworkSpec: %v: the two disagree", merr, err)
			}
		})
	}
}
