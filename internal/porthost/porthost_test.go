package porthost

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		host string
		want Host
		ok   bool
		err  error
	}{
		{"8080-abc123.example.com", Host{Port: 8080, ID: "abc123", Domain: "example.com", Canonical: true}, true, nil},
		{"49983-ID.Example.COM", Host{Port: 49983, ID: "id", Domain: "example.com", Canonical: true}, true, nil},
		{"080-abc.localhost", Host{Port: 80, ID: "abc", Domain: "localhost"}, true, nil},
		{"1-a.", Host{Port: 1, ID: "a", Canonical: true}, true, nil},
		{"0-abc.example.com", Host{}, true, ErrPort},
		{"65536-abc.example.com", Host{}, true, ErrPort},
		{"123456-abc.example.com", Host{}, false, nil},
		{"8080-abc", Host{}, false, nil},
		{"api.example.com", Host{}, false, nil},
		{"8080-ab_c.example.com", Host{}, false, nil},
		{"8080-.example.com", Host{}, false, nil},
		{"-abc.example.com", Host{}, false, nil},
		{"+80-abc.example.com", Host{}, false, nil},
	} {
		got, ok, err := Parse(tc.host)
		if got != tc.want || ok != tc.ok || !errors.Is(err, tc.err) {
			t.Errorf("Parse(%q) = %+v, %v, %v; want %+v, %v, %v", tc.host, got, ok, err, tc.want, tc.ok, tc.err)
		}
	}
}
