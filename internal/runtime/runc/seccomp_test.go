package runc

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/seccomprules"
)

func TestSeccompProfile(t *testing.T) {
	p := seccompProfile()
	if p.DefaultAction != specs.ActAllow || len(p.Architectures) != 3 {
		t.Fatalf("default %s, arches %v", p.DefaultAction, p.Architectures)
	}
	denied := map[string]bool{}
	var mptcp, cloneRules int
	for _, s := range p.Syscalls {
		if s.Action != specs.ActErrno || s.ErrnoRet == nil {
			t.Fatalf("rule %v does not return an errno", s.Names)
		}
		switch {
		case len(s.Args) == 0:
			for _, n := range s.Names {
				denied[n] = true
			}
		case slices.Contains(s.Names, "socket"):
			if s.Args[0].Index == 2 && s.Args[0].Value == 262 && *s.ErrnoRet == uint(unix.EPROTONOSUPPORT) {
				mptcp++
			}
		case slices.Contains(s.Names, "clone"):
			cloneRules++
		}
	}
	for _, name := range []string{"keyctl", "add_key", "request_key", "bpf", "userfaultfd", "perf_event_open", "kexec_load",
		"kexec_file_load", "init_module", "finit_module", "delete_module", "mount", "umount2", "pivot_root", "unshare", "setns",
		"open_by_handle_at", "io_uring_setup", "fsopen", "clone3"} {
		if !denied[name] {
			t.Errorf("%s is not refused", name)
		}
	}
	if mptcp != 1 {
		t.Errorf("MPTCP socket rule missing")
	}
	if cloneRules != len(seccomprules.NamespaceCloneFlags()) {
		t.Errorf("%d clone rules, want one per namespace flag (%d)", cloneRules, len(seccomprules.NamespaceCloneFlags()))
	}
	if _, err := json.Marshal(p); err != nil {
		t.Fatal(err)
	}
}

func TestDropCaps(t *testing.T) {
	got := dropCaps([]string{"CAP_CHOWN", "CAP_NET_RAW", "CAP_MKNOD", "CAP_SETUID"})
	if !slices.Equal(got, []string{"CAP_CHOWN", "CAP_SETUID"}) {
		t.Fatalf("got %v", got)
	}
}

func TestSeccompReason(t *testing.T) {
	tests := map[string]string{
		"bpf":    "loading eBPF programs is not allowed in sandboxes",
		"keyctl": "kernel keyrings are shared with the host and not allowed in sandboxes",
		"socket": reasonMPTCP,
		"read":   reasonFallback,
	}
	for name, want := range tests {
		if got := SeccompReason(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	// Every refused name has a reason of its own.
	for _, n := range deniedSyscalls() {
		if SeccompReason(n) == reasonFallback {
			t.Errorf("%s has no reason", n)
		}
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
			r := &Runtime{cfg: Config{UserNS: tc.userns, UserNSBase: DefaultUserNSBase, UserNSSize: DefaultUserNSSize, EnvdPath: "/envd"}, auditSyscalls: auditedSyscalls()}
			spec := runtime.Spec{ID: "x", Runtime: tc.tier}
			s := r.harden(r.ociSpec(spec, t.TempDir()), spec)
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
