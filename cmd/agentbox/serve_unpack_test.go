package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/untar"
)

func TestUnpackFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want untar.Limits
		err  string // in the refusal
	}{
		{name: "unset keeps every default", want: untar.Limits{}},
		{name: "sizes in MiB", args: []string{"--unpack-max-size=2048", "--unpack-max-file-size=512"}, want: untar.Limits{MaxBytes: 2 << 30, MaxEntryBytes: 512 << 20}},
		{name: "entries and ratio", args: []string{"--unpack-max-entries=5000", "--unpack-max-ratio=20"}, want: untar.Limits{MaxEntries: 5000, MaxRatio: 20}},
		{name: "negative size", args: []string{"--unpack-max-size=-1"}, err: "--unpack-max-size -1"},
		{name: "negative entries", args: []string{"--unpack-max-entries=-5"}, err: "--unpack-max-entries -5"},
		{name: "size past what bytes hold", args: []string{"--unpack-max-file-size=9000000000000"}, err: "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			var u unpackFlags
			addUnpackFlags(f, &u)
			if err := f.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := u.limits()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
