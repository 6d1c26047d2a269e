package seccomprules

import (
	"encoding/json"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestSeccompProfile(t *testing.T) {
	p := Profile()
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
	if cloneRules != len(NamespaceCloneFlags()) {
		t.Errorf("%d clone rules, want one per namespace flag (%d)", cloneRules, len(NamespaceCloneFlags()))
	}
	if _, err := json.Marshal(p); err != nil {
		t.Fatal(err)
	}
}

func TestReason(t *testing.T) {
	tests := map[string]string{
		"bpf":    "loading eBPF programs is not allowed in sandboxes",
		"keyctl": "kernel keyrings are shared with the host and not allowed in sandboxes",
		"socket": reasonMPTCP,
		"read":   reasonFallback,
	}
	for name, want := range tests {
		if got := Reason(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	// Every refused name has a reason of its own.
	for _, n := range DeniedSyscalls() {
		if Reason(n) == reasonFallback {
			t.Errorf("%s has no reason", n)
		}
	}
}
