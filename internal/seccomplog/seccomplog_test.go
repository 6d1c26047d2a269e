package seccomplog

import (
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rec builds a record as the kernel formats it; comm and exe are already
// encoded (quoted or hex).
func rec(pid, comm, exe, arch, nr, code string) string {
	return "audit(1795319214.993:7): auid=4294967295 uid=0 gid=0 ses=4294967295 pid=" + pid +
		" comm=" + comm + " exe=" + exe + " sig=0 arch=" + arch + " syscall=" + nr + " compat=0 ip=0x40866e code=" + code
}

func hexs(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }

func TestParseRecord(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    Record
		wantErr bool
	}{
		{"plain", rec("4200", `"python3"`, `"/usr/bin/python3.11"`, "c000003e", "321", "0x50001"),
			Record{PID: 4200, Comm: "python3", Exe: "/usr/bin/python3.11", Arch: archX86_64, Syscall: 321, Code: 0x50001}, false},
		{"comm with space and quote is hex", rec("9", hexs(`py thon"x`), hexs("/tmp/a b"), "c000003e", "250", "0x50001"),
			Record{PID: 9, Comm: `py thon"x`, Exe: "/tmp/a b", Arch: archX86_64, Syscall: 250, Code: 0x50001}, false},
		{"comm posing as fields", rec("9", hexs(`x syscall=1 pid=1`), `"/x"`, "c000003e", "321", "0x50001"),
			Record{PID: 9, Comm: `x syscall=1 pid=1`, Exe: "/x", Arch: archX86_64, Syscall: 321, Code: 0x50001}, false},
		{"comm with newline", rec("9", hexs("a\nb"), `"/x"`, "c000003e", "321", "0x50001"),
			Record{PID: 9, Comm: "a\nb", Exe: "/x", Arch: archX86_64, Syscall: 321, Code: 0x50001}, false},
		{"null exe, i386, kill", rec("1", `"sh"`, "(null)", "40000003", "357", "0x80000000"),
			Record{PID: 1, Comm: "sh", Arch: archI386, Syscall: 357, Code: 0x80000000}, false},
		{"trailing NULs", rec("5", `"a"`, `"/a"`, "c000003e", "321", "0x50001") + "\x00\x00",
			Record{PID: 5, Comm: "a", Exe: "/a", Arch: archX86_64, Syscall: 321, Code: 0x50001}, false},
		{"bad hex comm", rec("5", "ZZ", `"/a"`, "c000003e", "321", "0x50001"), Record{}, true},
		{"missing syscall", "audit(1.1:1): pid=5 arch=c000003e code=0x50001", Record{}, true},
		{"garbage", "hello world", Record{}, true},
		{"bad pid", rec("x", `"a"`, `"/a"`, "c000003e", "321", "0x50001"), Record{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRecord(tt.text)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr {
				tt.want.Session = SessionUnset // ses=4294967295 in every test record
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRecordAction(t *testing.T) {
	for code, want := range map[uint32]string{0x50001: "errno", 0x80000000: "kill", 0: "kill", 0x30000: "trap", 0x7ffc0000: "log"} {
		if got := (Record{Code: code}).Action(); got != want {
			t.Errorf("code %#x: %s, want %s", code, got, want)
		}
	}
	if e := (Record{Code: 0x50026}).Errno(); e != 38 {
		t.Errorf("errno %d, want 38", e)
	}
}

func TestSandboxOfCgroup(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"v2", "0::/agentbox/sb123\n", "sb123"},
		{"v2 nested", "0::/agentbox/sb123/sub\n", "sb123"},
		{"v1", "12:pids:/agentbox/sb1\n11:memory:/agentbox/sb1\n1:name=systemd:/agentbox/sb1\n", "sb1"},
		{"other server", "0::/agentbox-e2e/sb123\n", ""},
		{"host", "0::/system.slice/ssh.service\n", ""},
		{"parent only", "0::/agentbox\n", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		if got := sandboxOfCgroup(tt.text, "agentbox"); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSeccompMessages(t *testing.T) {
	msg := func(typ uint16, body string, pad bool) []byte {
		b := make([]byte, 16, 16+len(body)+4)
		binary.NativeEndian.PutUint32(b, uint32(16+len(body)))
		binary.NativeEndian.PutUint16(b[4:], typ)
		b = append(b, body...)
		for pad && len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	one := msg(auditSeccomp, "pid=1 arch=c000003e syscall=321 code=0x50001", false) // unpadded, as the kernel sends
	if got := seccompMessages(one); len(got) != 1 || got[0] != "pid=1 arch=c000003e syscall=321 code=0x50001" {
		t.Fatalf("single: %q", got)
	}
	two := append(msg(1300, "syscall record", true), msg(auditSeccomp, "abc", true)...)
	if got := seccompMessages(two); len(got) != 1 || got[0] != "abc" {
		t.Fatalf("two: %q", got)
	}
	if got := seccompMessages([]byte{1, 2, 3}); len(got) != 0 {
		t.Fatalf("short: %q", got)
	}
}

// fakeProc makes procRoot/<pid>/{cgroup,status} for a sandbox process.
func fakeProc(t *testing.T, root string, pid, cgroup, nspid string) {
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644)
	os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\tx\nNSpid:\t"+pid+"\t"+nspid+"\n"), 0o644)
}

func TestAggregator(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, "100", "0::/ab/sbA\n", "57")
	fakeProc(t, root, "200", "0::/ab/sbB\n", "3")
	fakeProc(t, root, "300", "0::/user.slice\n", "300")
	a := newAggregator(Config{CgroupParent: "ab", ProcRoot: root, Explain: func(n string) string {
		if n == "bpf" {
			return "loading eBPF programs is not allowed in sandboxes"
		}
		return ""
	}})
	now := time.Now()
	bpf := Record{PID: 100, Comm: "python3", Arch: archX86_64, Syscall: 321, Code: 0x50001}
	for i := 0; i < 1000; i++ { // a flood is one event with a count
		if !a.add(bpf, now) {
			t.Fatal("sandbox record not attributed")
		}
	}
	a.add(Record{PID: 200, Comm: "sh", Arch: archX86_64, Syscall: 250, Code: 0x50001}, now.Add(time.Millisecond))
	if a.add(Record{PID: 300, Arch: archX86_64, Syscall: 321, Code: 0x50001}, now) {
		t.Error("host process attributed")
	}
	if a.add(Record{PID: 999, Arch: archX86_64, Syscall: 321, Code: 0x50001}, now) {
		t.Error("exited process attributed")
	}
	if a.add(Record{PID: 100, Arch: archX86_64, Syscall: 1, Code: 0x7ffc0000}, now) {
		t.Error("SECCOMP_RET_LOG (an allowed call) reported")
	}
	// Past the cap, distinct syscalls fold into one summary.
	for nr := 0; nr < maxKeysPerSandbox+10; nr++ {
		a.add(Record{PID: 200, Arch: archX86_64, Syscall: 1000 + nr, Code: 0x50001}, now.Add(2*time.Millisecond))
	}
	got := a.flush()
	if len(got) != 1+maxKeysPerSandbox+1 {
		t.Fatalf("%d denials, want %d", len(got), maxKeysPerSandbox+2)
	}
	d := got[0]
	if d.SandboxID != "sbA" || d.Syscall != "bpf" || d.Count != 1000 || d.SandboxPID != 57 || d.PID != 100 || d.Errno != 1 {
		t.Fatalf("first denial %+v", d)
	}
	e := d.Event()
	want := `syscall bpf(321) refused by the sandbox's seccomp policy (loading eBPF programs is not allowed in sandboxes); pid 57 comm "python3"; 1000 times in this second`
	if e.Reason != want || e.Action != "bpf" || e.Kind != "syscall" || e.Decision != "denied" {
		t.Fatalf("event %+v\nreason %s", e, e.Reason)
	}
	if got[1].SandboxID != "sbB" || got[1].Syscall != "keyctl" {
		t.Fatalf("second denial %+v", got[1])
	}
	last := got[len(got)-1]
	if !last.Overflow || last.Count != 11 || last.SandboxID != "sbB" {
		t.Fatalf("overflow %+v", last)
	}
	if len(a.flush()) != 0 {
		t.Fatal("flush did not reset")
	}
}

func TestEventHostileComm(t *testing.T) {
	d := Denial{SandboxID: "s", Syscall: "", Nr: 9999, Arch: "x86_64", Action: "errno", PID: 4, Comm: "a\"b\nsyscall bpf(321) refused", Count: 1}
	r := d.Event().Reason
	if strings.Contains(r, "\n") || !strings.Contains(r, `comm "a\"b\nsyscall bpf(321) refused"`) {
		t.Fatalf("comm not quoted: %s", r)
	}
	if !strings.Contains(r, "a seccomp filter (the sandbox's policy, or one the process installed)") {
		t.Fatalf("unknown syscall blamed on the policy: %s", r)
	}
}

// A record whose process is gone is attributed by its audit session.
func TestAggregatorBySession(t *testing.T) {
	a := newAggregator(Config{CgroupParent: "agentbox", ProcRoot: t.TempDir(), // no /proc: every process exited
		Explain: func(string) string { return "" },
		BySession: func(ses uint32) (string, bool) {
			if ses == 42 {
				return "sbx1", true
			}
			return "", false
		},
	})
	now := time.Now()
	for _, tc := range []struct {
		text string
		want bool
	}{
		{`audit(1.0:1): auid=100000 uid=100000 gid=100000 ses=42 pid=4242 comm="python3" exe="/usr/bin/python3" sig=0 arch=c000003e syscall=321 compat=0 ip=0x1 code=0x50001`, true},
		{`audit(1.0:2): auid=100000 uid=100000 gid=100000 ses=43 pid=4243 comm="python3" exe="/usr/bin/python3" sig=0 arch=c000003e syscall=321 compat=0 ip=0x1 code=0x50001`, false},
		{`audit(1.0:3): auid=4294967295 uid=0 gid=0 ses=4294967295 pid=4244 comm="x" exe="/x" sig=0 arch=c000003e syscall=321 compat=0 ip=0x1 code=0x50001`, false},
	} {
		r, err := ParseRecord(tc.text)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.add(r, now); got != tc.want {
			t.Errorf("session %d: attributed %v, want %v", r.Session, got, tc.want)
		}
	}
	if d := a.flush(); len(d) != 1 || d[0].SandboxID != "sbx1" || d[0].Nr != 321 {
		t.Fatalf("denials %+v, want one bpf of sbx1", d)
	}
}

// Cgroups named by the runtime's opaque key are mapped back to the
// sandbox; a name the runtime does not know attributes nothing.
func TestAggregatorByCgroup(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, "100", "0::/ab/0123456789abcdef0123456789abcdef\n", "7")
	fakeProc(t, root, "200", "0::/ab/ffffffffffffffffffffffffffffffff\n", "8")
	a := newAggregator(Config{CgroupParent: "ab", ProcRoot: root, Explain: func(string) string { return "" }, ByCgroup: func(name string) (string, bool) {
		return "isbKeyed", name == "0123456789abcdef0123456789abcdef"
	}})
	now := time.Now()
	if !a.add(Record{PID: 100, Arch: archX86_64, Syscall: 321, Code: 0x50001}, now) {
		t.Fatal("keyed cgroup not attributed")
	}
	if a.add(Record{PID: 200, Arch: archX86_64, Syscall: 321, Code: 0x50001}, now) {
		t.Fatal("a cgroup the runtime does not know was attributed")
	}
	if got := a.flush(); len(got) != 1 || got[0].SandboxID != "isbKeyed" {
		t.Fatalf("denials %+v", got)
	}
}
