package runc

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/seccomprules"
)

func TestDropCaps(t *testing.T) {
	got := dropCaps([]string{"CAP_CHOWN", "CAP_NET_RAW", "CAP_MKNOD", "CAP_SETUID"})
	if !slices.Equal(got, []string{"CAP_CHOWN", "CAP_SETUID"}) {
		t.Fatalf("got %v", got)
	}
}

// envd gets CAP_SYS_ADMIN (to stack the logging filter, then drop it) only
// inside the sandbox's own user namespace, never with the host's.
func TestAuditFilterNeedsUserNS(t *testing.T) {
	for _, tc := range []struct {
		name   string
		userns bool
		tier   string
		want   bool
	}{
		{"container tier, user namespace", true, TierRunc, true},
		{"container tier, host user namespace", false, TierRunc, false},
		{"gvisor", true, TierRunsc, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Runtime{cfg: Config{UserNS: tc.userns, UserNSBase: DefaultUserNSBase, UserNSSize: DefaultUserNSSize, EnvdPath: "/envd"}, auditSyscalls: seccomprules.AuditedSyscalls()}
			spec := runtime.Spec{ID: "x", Runtime: tc.tier}
			s := r.harden(r.ociSpec(spec, t.TempDir(), DefaultUserNSBase), spec)
			args := strings.Join(s.Process.Args, " ")
			hasArg := strings.Contains(args, "--audit-syscalls")
			hasCap := slices.Contains(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
			if hasArg != tc.want || hasCap != tc.want {
				t.Fatalf("--audit-syscalls %v, CAP_SYS_ADMIN %v; want %v", hasArg, hasCap, tc.want)
			}
			if tc.want && !strings.Contains(args, "321") {
				t.Errorf("bpf (321) is not in %q", args)
			}
		})
	}
}
