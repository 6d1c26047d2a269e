package runc

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
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
		want   bool
	}{
		{"user namespace", true, true},
		{"host user namespace", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bundle.New(bundle.Config{StateDir: filepath.Join(t.TempDir(), "s"), EnvdPath: "/envd", CgroupParent: "agentbox-test", UserNS: tc.userns}, nil)
			if err != nil {
				t.Skip(err) // not root: cannot make the parent cgroup
			}
			d := &Driver{b: b, auditSyscalls: seccomprules.AuditedSyscalls()}
			o := d.options()
			o.OwnNet = false
			s := b.HardenedSpec(runtime.Spec{ID: "x"}, t.TempDir(), o, bundle.DefaultUserNSBase)
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
	// gVisor keeps its own kernel: a bundle without the driver's hardening.
	b, err := bundle.New(bundle.Config{StateDir: filepath.Join(t.TempDir(), "s"), EnvdPath: "/envd", CgroupParent: "agentbox-test", UserNS: true}, nil)
	if err != nil {
		t.Skip(err)
	}
	s := b.HardenedSpec(runtime.Spec{ID: "x"}, t.TempDir(), bundle.Options{Tier: "runsc"}, 0)
	if strings.Contains(strings.Join(s.Process.Args, " "), "--audit-syscalls") || s.Linux.Seccomp != nil {
		t.Fatal("a bundle without the runc driver's hardening has its filter")
	}
}
