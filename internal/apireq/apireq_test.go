package apireq

import (
	"errors"
	"maps"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestKey(t *testing.T) {
	tests := []struct {
		name, apiKey, auth, want string
	}{
		{"header", "e2b_a", "", "e2b_a"},
		{"bearer", "", "Bearer e2b_b", "e2b_b"},
		{"header wins", "e2b_a", "Bearer e2b_b", "e2b_a"},
		{"basic is no key", "", "Basic dXNlcjpwdw==", ""},
		{"none", "", "", ""},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/sandboxes", nil)
		if tt.apiKey != "" {
			r.Header.Set("X-API-Key", tt.apiKey)
		}
		if tt.auth != "" {
			r.Header.Set("Authorization", tt.auth)
		}
		if got := Key(r); got != tt.want {
			t.Errorf("%s: Key = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestParseListFilters(t *testing.T) {
	tests := []struct {
		query      string
		wantMeta   map[string]string
		wantStates []string
		wantErr    bool
	}{
		{query: "", wantMeta: nil},
		{query: "metadata=" + url.QueryEscape("user=abc&app=prod"), wantMeta: map[string]string{"user": "abc", "app": "prod"}},
		{query: "metadata=" + url.QueryEscape("k=1&k=2"), wantMeta: map[string]string{"k": "2"}},
		{query: "state=running,paused", wantStates: []string{"running", "paused"}},
		{query: "state=running&state=paused", wantStates: []string{"running", "paused"}},
		{query: "state=stopped", wantErr: true},
		{query: "metadata=%25zz", wantErr: true},
	}
	for _, tt := range tests {
		q, err := url.ParseQuery(tt.query)
		if err != nil {
			t.Fatal(err)
		}
		f, err := ParseListFilters(q)
		if tt.wantErr {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: err %v, want an invalid argument", tt.query, err)
			}
			continue
		}
		if err != nil || !maps.Equal(f.Metadata, tt.wantMeta) || !slices.Equal(f.States, tt.wantStates) {
			t.Errorf("%q: %+v, %v; want %v %v", tt.query, f, err, tt.wantMeta, tt.wantStates)
		}
	}
}
