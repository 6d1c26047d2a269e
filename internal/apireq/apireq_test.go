package apireq

import (
	"errors"
	"maps"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
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
		// What the e2b JS SDK (2.50, 2.51) sends for
		// {idx: "one & two=2/é", "k&=/%+ é": "v&=/%+ ü 100%"}: each key
		// and value encoded, the pairs form-encoded, the parameter encoded.
		{query: "metadata=idx%3Done%252520%252526%252520two%25253D2%25252F%2525C3%2525A9%26k%252526%25253D%25252F%252525%25252B%252520%2525C3%2525A9%3Dv%252526%25253D%25252F%252525%25252B%252520%2525C3%2525BC%252520100%252525",
			wantMeta: map[string]string{"idx": "one & two=2/é", "k&=/%+ é": "v&=/%+ ü 100%"}},
		// The same through Go's encoders (sdk/go).
		{query: url.Values{"metadata": {url.Values{url.QueryEscape("a&b"): {url.QueryEscape("c=d+e f")}}.Encode()}}.Encode(), wantMeta: map[string]string{"a&b": "c=d+e f"}},
		{query: "metadata=" + url.QueryEscape("=empty-key"), wantMeta: map[string]string{"": "empty-key"}},
		{query: "state=running,paused", wantStates: []string{"running", "paused"}},
		{query: "state=running&state=paused", wantStates: []string{"running", "paused"}},
		{query: "state=stopped", wantErr: true},
		// Malformed filters are refused, as E2B refuses them (400).
		{query: "metadata=%25zz", wantErr: true},
		{query: "metadata=user", wantErr: true},
		{query: "metadata=" + url.QueryEscape("a=1&"), wantErr: true},
		{query: "metadata=" + url.QueryEscape("a=b=c"), wantErr: true},
		{query: "metadata=" + url.QueryEscape("a=%zz"), wantErr: true},
		{query: "metadata=" + url.QueryEscape("%25zz=1"), wantErr: true},
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

func TestPage(t *testing.T) {
	items := []string{"a", "b", "c", "d", "e"}
	id := func(s string) string { return s }
	for _, tc := range []struct {
		after    string
		limit    int
		want     []string
		wantNext string
	}{
		{"", 2, []string{"a", "b"}, "b"},
		{"b", 2, []string{"c", "d"}, "d"},
		{"d", 2, []string{"e"}, ""},
		{"", 5, []string{"a", "b", "c", "d", "e"}, ""},
		{"e", 2, []string{}, ""},
		{"gone", 2, []string{}, ""}, // a token naming nothing ends the list
	} {
		page, next := Page(items, id, tc.after, tc.limit)
		if !slices.Equal(page, tc.want) || next != tc.wantNext {
			t.Errorf("Page(after %q, limit %d) = %q, next %q; want %q, next %q", tc.after, tc.limit, page, next, tc.want, tc.wantNext)
		}
	}
}

func TestSnapshotLimit(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int
		bad  bool
	}{{"", 100, false}, {"1", 1, false}, {"100", 100, false}, {"0", 0, true}, {"101", 0, true}, {"x", 0, true}} {
		n, err := SnapshotLimit(url.Values{"limit": {tc.v}})
		if tc.bad != (err != nil) || (!tc.bad && n != tc.want) {
			t.Errorf("SnapshotLimit(%q) = %d, %v", tc.v, n, err)
		}
		if tc.bad && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "limit")) {
			t.Errorf("SnapshotLimit(%q) error %v: want an invalid argument naming limit", tc.v, err)
		}
	}
}
