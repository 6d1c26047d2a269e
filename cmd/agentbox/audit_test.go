package main

import (
	"testing"
	"time"
)

func TestDaysFlag(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		str  string
		bad  bool
	}{
		{in: "30d", want: 30 * 24 * time.Hour, str: "30d"},
		{in: "12h", want: 12 * time.Hour, str: "12h0m0s"},
		{in: "0", want: 0, str: "0s"},
		{in: "1.5d", bad: true},
		{in: "-1h", bad: true},
		{in: "d", bad: true},
	}
	for _, tc := range tests {
		var d days
		err := d.Set(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("%q accepted as %v", tc.in, time.Duration(d))
			}
			continue
		}
		if err != nil || time.Duration(d) != tc.want || d.String() != tc.str {
			t.Errorf("%q: %v %q (%v), want %v %q", tc.in, time.Duration(d), d.String(), err, tc.want, tc.str)
		}
	}
}

func TestAuditFlagsRefuseNonsense(t *testing.T) {
	ok := auditFlags{MaxAge: days(time.Hour), MaxRows: 10, MaxBytes: 1 << 20, Rate: 5, Burst: 10}
	if _, err := ok.options(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*auditFlags){
		"negative rows": func(a *auditFlags) { a.MaxRows = -1 },
		"negative size": func(a *auditFlags) { a.MaxBytes = -1 },
		"zero burst":    func(a *auditFlags) { a.Burst = 0 },
		"zero rate":     func(a *auditFlags) { a.Rate = 0 },
	} {
		a := ok
		mod(&a)
		if _, err := a.options(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
