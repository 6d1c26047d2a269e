package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The egress fault is a test switch: neither the environment nor a config
// file may arm it on a production server.
func TestEgressFaultOnlyFromCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		want      time.Duration
	}{
		{name: "environment ignored", env: "1s"},
		{name: "command line honoured", args: []string{"--test-fail-egress-proxy", "2s"}, want: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l lifecycleFlags
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			addLifecycleFlags(fs, &l)
			t.Setenv("AGENTBOX_TEST_FAIL_EGRESS_PROXY", tc.env)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := applyEnvAndFile(fs, ""); err != nil {
				t.Fatal(err)
			}
			if l.FailEgressEvery != tc.want {
				t.Fatalf("egress fault every %v, want %v", l.FailEgressEvery, tc.want)
			}
		})
	}
}
