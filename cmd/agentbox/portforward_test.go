package main

import "testing"

func TestParsePortMapping(t *testing.T) {
	for _, tc := range []struct {
		in            string
		local, remote int
		bad           bool
	}{
		{in: "8080:80", local: 8080, remote: 80},
		{in: "5432", local: 5432, remote: 5432},
		{in: ":6379", local: 0, remote: 6379},
		{in: "0:6379", local: 0, remote: 6379},
		{in: "80:0", bad: true},
		{in: "x:80", bad: true},
		{in: "70000", bad: true},
		{in: "-1:80", bad: true},
	} {
		l, r, err := parsePortMapping(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && (l != tc.local || r != tc.remote)) {
			t.Errorf("parsePortMapping(%q) = %d, %d, %v", tc.in, l, r, err)
		}
	}
}
