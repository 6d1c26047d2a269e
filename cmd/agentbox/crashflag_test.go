package main

import (
	"testing"

	"github.com/spf13/pflag"
)

// A crash point is a test switch: neither the environment nor a config
// file may arm it on a production server.
func TestCrashSwitchOnlyFromCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name, env, flag string
		want            string
	}{
		{name: "environment ignored", env: "create/start", want: ""},
		{name: "command line honoured", flag: "create/start", want: "create/start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l lifecycleFlags
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			addLifecycleFlags(fs, &l)
			t.Setenv("AGENTBOX_TEST_CRASH_AFTER", tc.env)
			t.Setenv("AGENTBOX_FAULT_STEP", tc.env)
			var args []string
			if tc.flag != "" {
				args = []string{"--test-crash-after", tc.flag}
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if err := applyEnvAndFile(fs, ""); err != nil {
				t.Fatal(err)
			}
			if l.CrashAfter != tc.want || l.FaultStep != "" {
				t.Fatalf("crash after %q, fault step %q; want %q and none", l.CrashAfter, l.FaultStep, tc.want)
			}
		})
	}
}
