package containment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// attack is one escape or abuse attempt. script runs inside the sandbox
// (bash, as user, default root: the agent may become root there) and exits
// 0 when the attempt was contained; api runs from outside against the
// sandbox's API surface; host double-checks on the host afterwards.
type attack struct {
	name   string
	user   string
	script string
	fresh  bool // destructive: gets a sandbox of its own
	api    func(ctx context.Context, e *env) error
	host   func(e *env) error
	// sentry: on gvisor the call is served by gVisor's user-space kernel
	// (its own keyrings, namespaces, mounts, sysctls), so success there
	// reaches nothing of the host; the host and neighbour checks decide.
	sentry bool
	// audited names the syscall whose refusal must then appear as a
	// "syscall" event in the sandbox's audit log on the container tier.
	audited string
	// gap names a tier where this attack is known not to be contained yet,
	// and why; it is reported as GAP (a failure with CONTAINMENT_STRICT=1).
	gap map[string]string
}

// sc calls a raw syscall with integer or string arguments and succeeds
// when the kernel (or gVisor) refused it: EPERM, EACCES, ENOSYS,
// EOPNOTSUPP or EPROTONOSUPPORT. Bogus arguments make a syscall that was
// NOT filtered fail with EINVAL/EFAULT instead, which counts as escaped.
const scHelper = `import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
args = []
for a in sys.argv[2:]:
    try:
        args.append(ctypes.c_long(int(a, 0)))
    except ValueError:
        args.append(ctypes.c_char_p(a.encode()))
r = libc.syscall(int(sys.argv[1]), *args)
e = ctypes.get_errno()
print("syscall", sys.argv[1], "->", r, errno.errorcode.get(e, e))
sys.exit(0 if r == -1 and e in (errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPROTONOSUPPORT) else 1)
`

func sc(nr int, args ...string) string {
	return fmt.Sprintf("python3 /opt/ct/sc.py %d %s", nr, strings.Join(args, " "))
}

// refused runs a command that must fail.
func refused(cmd string) string { return "! ( " + cmd + " ) 2>&1" }

// reach is a shell function: true when host $1 port $2 answers with at
// least one byte. A bare TCP handshake proves nothing: the egress proxy
// accepts every connection before it decides.
const reach = `reach() { timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && [ -n \"\$(head -c1 <&3 | od -An -c)\" ]" 2>/dev/null; }; `

func noHostFile(glob string) func(e *env) error {
	return func(e *env) error {
		m, _ := filepath.Glob(strings.ReplaceAll(glob, "PROBE", e.probe))
		if len(m) > 0 {
			return fmt.Errorf("found on the host: %v", m)
		}
		return nil
	}
}

func attacks() []attack {
	return append(envdAttacks(), []attack{
		// ---- host files ----
		{name: "read host /etc/shadow", script: `[ "$(sha256sum /etc/shadow | cut -d' ' -f1)" != "$HOST_SHADOW_SHA" ]`},
		{name: "read host canary file", script: refused(`cat "$CANARY"`) + ` && ! grep -rqs "$CANARY_TOKEN" /tmp /root /var/tmp`},
		{name: "read server data dir", script: `[ ! -e "$DATA_DIR/agentbox.db" ] && [ ! -e "$DATA_DIR/apikey" ]`},
		{name: "read server API key file", script: refused(`cat "$DATA_DIR/apikey"`)},
		// Mount tables show each mount's source path and options: they
		// must not tell where the server keeps its state and templates.
		{name: "host paths in mountinfo", script: `set -- /var/cache/agentbox /var/lib/agentbox /run/$INSTANCE/ $DATA_DIR ${TEMPLATE_DIR:-}
for f in /proc/self/mountinfo /proc/1/mountinfo /proc/self/mounts /proc/1/maps /proc/self/cgroup; do
  [ -r $f ] || continue
  for p; do grep -F -- "$p" $f | head -3 | grep . && { echo "$f names $p"; exit 1; }; done
done; true`},
		{name: "find host processes", script: `! ps -eo comm | grep -Eqx 'agentbox|runc|runsc|runsc-gofer|runsc-sandbox|systemd|sshd|containerd|dockerd|kubelet|node'`},
		// envd (PID 1) is not dumpable, so its root link is closed to
		// sandbox root; if it can be read, it must be the sandbox's.
		{name: "/proc/1/root is the sandbox or closed", script: `if h=$(cat /proc/1/root/etc/hostname 2>/dev/null); then [ "$h" = "$(hostname)" ]; else ! ls /proc/1/root/ >/dev/null 2>&1; fi && [ "$(hostname)" != "$HOST_HOSTNAME" ]`},
		{name: "write outside the sandbox", script: `touch /ab-probe-$PROBE /tmp/ab-probe-$PROBE 2>/dev/null; true`, host: noHostFile("/ab-probe-PROBE")},
		{name: "chroot breakout (classic ..)", script: `python3 - <<'EOF'
import hashlib, os
os.makedirs("/opt/ct/jail", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
os.chroot("/opt/ct/jail")
os.fchdir(fd)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
escaped = False
try:
    escaped = os.environ["CANARY_TOKEN"] in open(os.environ["CANARY"]).read()
except OSError:
    pass
try:
    escaped = escaped or hashlib.sha256(open("/etc/shadow", "rb").read()).hexdigest() == os.environ["HOST_SHADOW_SHA"]
except OSError:
    pass
raise SystemExit(1 if escaped else 0)
EOF`},
		{name: "overwrite envd binary", script: refused(`cp /bin/true /.agentbox/bin/envd`)},
		{name: "write through /proc/1/exe", script: refused(`echo x >> /proc/1/exe`)},
		{name: "write bind-mounted /etc/hosts", script: refused(`echo 6.6.6.6 evil >> /etc/hosts`)},
		{name: "umount bind-mounted /etc/resolv.conf", script: refused(`umount /etc/resolv.conf`)},
		{name: "read /proc/kcore", script: `[ "$(head -c 16 /proc/kcore 2>/dev/null | wc -c)" = 0 ]`},
		{name: "read kernel symbols", script: `! grep -v '^0000000000000000' /proc/kallsyms 2>/dev/null | grep -q .`},
		{name: "read the host kernel log (dmesg)", script: `! dmesg 2>/dev/null | grep -q "Linux version"`},
		{name: "read host keyrings /proc/keys", script: `! grep -q . /proc/keys 2>/dev/null`},

		// ---- mounts and namespaces ----
		{name: "mount tmpfs", sentry: true, script: refused(`mount -t tmpfs x /mnt`)},
		{name: "bind mount /", sentry: true, script: refused(`mount --bind / /mnt`)},
		{name: "mount proc", sentry: true, script: refused(`mkdir -p /opt/ct/p && mount -t proc proc /opt/ct/p`)},
		{name: "mount cgroup v1 (release_agent)", script: refused(`mkdir -p /opt/ct/cg && mount -t cgroup -o memory cgroup /opt/ct/cg`)},
		{name: "remount /sys/fs/cgroup rw", script: refused(`mount -o remount,rw /sys/fs/cgroup`)},
		{name: "mount syscall", sentry: true, script: sc(165, "none", "/mnt", "tmpfs", "0", "0")},
		{name: "new mount API fsopen", sentry: true, script: sc(430, "tmpfs", "0")},
		{name: "open_tree", sentry: true, script: sc(428, "-100", "/", "0")},
		{name: "unshare user namespace", sentry: true, script: refused(`unshare -U true`)},
		{name: "unshare mount namespace", sentry: true, script: refused(`unshare -m true`)},
		{name: "unshare net namespace", sentry: true, script: refused(`unshare -n true`)},
		{name: "unshare pid namespace", sentry: true, script: refused(`unshare -p -f true`)},
		{name: "unshare cgroup namespace", sentry: true, script: refused(`unshare -C true`)},
		{name: "clone(CLONE_NEWUSER)", sentry: true, script: sc(56, "0x10000011", "0", "0", "0", "0"), audited: "clone(56)"},
		{name: "setns into init's namespaces", script: refused(`nsenter -t 1 -m -u -n -i -p true`)},
		{name: "pivot_root", sentry: true, script: sc(155, "/tmp", "/tmp")},

		// ---- kernel interfaces ----
		{name: "write /proc/sys/kernel/core_pattern", script: refused(`echo '|/tmp/x' > /proc/sys/kernel/core_pattern`)},
		{name: "write /proc/sys/vm/drop_caches", script: refused(`echo 3 > /proc/sys/vm/drop_caches`)},
		{name: "write /proc/sysrq-trigger", script: refused(`echo h > /proc/sysrq-trigger`)},
		{name: "sysctl net.ipv4.ip_forward", sentry: true, script: refused(`echo 1 > /proc/sys/net/ipv4/ip_forward`), host: hostForwardIntact},
		{name: "write /sys", script: refused(`echo 1 > /sys/kernel/mm/ksm/run`)},
		{name: "raise cgroup memory limit", script: `echo 1099511627776 > /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; echo max > /sys/fs/cgroup/memory.max 2>/dev/null; true`, host: hostLimitsIntact},
		{name: "raise cgroup pids limit", script: `echo max > /sys/fs/cgroup/pids/pids.max 2>/dev/null; echo max > /sys/fs/cgroup/pids.max 2>/dev/null; true`, host: hostLimitsIntact},
		{name: "move into the root cgroup", script: `for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do echo $$ > $f 2>/dev/null; done; true`, host: hostLimitsIntact},
		{name: "lower own oom_score_adj", sentry: true, script: refused(`echo -1000 > /proc/self/oom_score_adj`)},
		{name: "init_module", script: sc(175, "0", "0", "''")},
		{name: "finit_module", script: sc(313, "0", "''", "0")},
		{name: "delete_module", script: sc(176, "loop", "0")},
		{name: "modprobe", script: refused(`modprobe dummy`)},
		{name: "kexec_load", script: sc(246, "0", "0", "0", "0")},
		{name: "keyctl", sentry: true, script: sc(250, "0", "-3", "0"), audited: "keyctl(250)"},
		{name: "add_key", sentry: true, script: sc(248, "user", "ct", "0", "0", "-3")},
		{name: "request_key", sentry: true, script: sc(249, "user", "ct", "0", "-3")},
		{name: "bpf", sentry: true, script: sc(321, "5", "0", "0"), audited: "bpf(321)"},
		{name: "userfaultfd", sentry: true, script: sc(323, "0"), audited: "userfaultfd(323)"},
		{name: "perf_event_open", sentry: true, script: sc(298, "0", "0", "-1", "-1", "0")},
		{name: "open_by_handle_at (shocker)", script: sc(304, "-100", "0", "0")},
		{name: "io_uring_setup", sentry: true, script: sc(425, "1", "0")},
		{name: "reboot", script: sc(169, "0", "0", "0", "0")},
		{name: "swapon", script: sc(167, "/dev/null", "0")},
		{name: "settimeofday", script: sc(164, "0", "0")},
		{name: "acct", script: sc(163, "0")},

		// ---- devices ----
		{name: "mknod block device", script: refused(`mknod /opt/ct/sda b 8 0 && head -c 1 /opt/ct/sda`)},
		{name: "mknod /dev/mem", script: refused(`mknod /opt/ct/mem c 1 1 && head -c 1 /opt/ct/mem`)},
		{name: "/dev/kvm", script: `[ ! -e /dev/kvm ] && ` + refused(`mknod /opt/ct/kvm c 10 232 && exec 3<>/opt/ct/kvm`)},
		{name: "/dev/mem", script: refused(`head -c 1 /dev/mem`)},

		// ---- network ----
		{name: "raw IP socket", script: `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)' 2>/dev/null && exit 1 || true`},
		{name: "packet socket", script: `python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)' 2>/dev/null && exit 1 || true`},
		{name: "MPTCP socket (Landlock bypass)", script: `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)' 2>/dev/null && exit 1 || true`, audited: "socket(41)"},
		{name: "reach the host API port", script: reach + `! reach $HOST_GW $API_PORT && ! curl -sf -m 3 http://$HOST_GW:$API_PORT/health`},
		{name: "reach the host's other listeners", script: reach + `for p in $HOST_PORTS; do reach $HOST_GW $p && { echo "reached $HOST_GW:$p"; exit 1; }; done; true`},
		{name: "reach the host's external address", script: reach + `for a in $HOST_ADDRS; do for p in $API_PORT $HOST_PORTS; do reach $a $p && { echo "reached $a:$p"; exit 1; }; done; done; true`},
		{name: "reach the neighbour's envd", script: reach + `! reach $NB_IP 49983 && ! curl -sf -m 3 http://$NB_IP:49983/health`},
		{name: "reach the neighbour via the gateway", script: refused(`curl -sf -m 3 -H "E2b-Sandbox-Id: $NB_ID" -H "E2b-Sandbox-Port: 49983" http://$HOST_GW:$API_PORT/health`)},
		{name: "cloud metadata 169.254.169.254", script: refused(`curl -sf -m 3 http://169.254.169.254/`)},
		{name: "ARP spoof: take the neighbour's IP", script: refused(`ip addr add $NB_IP/32 dev eth0`)},
		{name: "change MAC address", script: refused(`ip link set dev eth0 address 02:42:de:ad:be:ef`)},
		{name: "add a route", script: refused(`ip route add 10.0.0.0/8 dev eth0`)},
		{name: "use another sandbox's envd token", api: otherToken},

		// ---- files API escapes ----
		{name: "files API: .. path read", api: filesDotDot},
		{name: "files API: symlink to /proc/1/root", api: filesSymlink},
		{name: "files API: upload ../ name (zip-slip)", api: uploadSlip, host: noHostFile("/tmp/ab-slip-PROBE")},
		{name: "tar-slip extraction", script: `cd /opt/ct && mkdir -p t && cd t && python3 - <<'EOF'
import tarfile, io, os
p = os.environ["PROBE"]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as t:
    for name in ["../../../../../../tmp/ab-tarslip-" + p, "/ab-tarslip-" + p]:
        data = b"x"
        ti = tarfile.TarInfo(name); ti.size = 1
        t.addfile(ti, io.BytesIO(data))
open("/opt/ct/slip.tar", "wb").write(buf.getvalue())
EOF
tar -xPf /opt/ct/slip.tar 2>/dev/null; true`, host: func(e *env) error {
			if err := noHostFile("/tmp/ab-tarslip-PROBE")(e); err != nil {
				return err
			}
			return noHostFile("/ab-tarslip-PROBE")(e)
		}},
		{name: "huge argv via the API", api: hugeArgv},
		{name: "huge env inside", script: `python3 -c "import os; os.execve('/bin/true', ['true'], {'X': 'y' * (200 << 20)})" 2>/dev/null && exit 1 || true`},

		// ---- resource abuse (own sandbox each) ----
		{name: "fork bomb", fresh: true, script: `python3 - <<'EOF'
import os, time
n = 0
while n < 100000:
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    except OSError as e:
        print("fork refused after", n, e)
        break
time.sleep(4)
raise SystemExit(0 if n < 100000 else 1)
EOF`},
		{name: "memory bomb", fresh: true, script: `python3 -c "
a = []
while True:
    a.append(bytearray(32 << 20))
"; rc=$?; echo "exit $rc"; [ $rc -ne 0 ]`},
		{name: "disk fill", fresh: true, script: `dd if=/dev/zero of=/home/user/fill bs=1M count=4096 2>&1 | tail -1; rm -f /home/user/fill; true`, host: hostDiskIntact},
		{name: "/tmp fill", fresh: true, script: `out=$(dd if=/dev/zero of=/tmp/fill bs=1M count=1024 2>&1); rm -f /tmp/fill; echo "$out" | grep -q 'No space left'`},
		{name: "CPU spin", fresh: true, script: `for i in 1 2 3 4; do timeout 6 sh -c 'while :; do :; done' & done; wait; true`},
		// The instances are held while the host is checked.
		{name: "inotify exhaustion", fresh: true, script: `cat > /opt/ct/ino.py <<'EOF'
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
for _ in range(100000):
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
open("/opt/ct/ino.count", "w").write(str(len(fds)))
time.sleep(15)
EOF
(python3 /opt/ct/ino.py >/dev/null 2>&1 &); for i in $(seq 50); do [ -e /opt/ct/ino.count ] && break; sleep 0.2; done; echo "instances held: $(cat /opt/ct/ino.count)"; true`, host: hostInotifyOK},
	}...)
}

func hostForwardIntact(e *env) error {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil || strings.TrimSpace(string(b)) != e.ipForward {
		return fmt.Errorf("host net.ipv4.ip_forward changed to %q", b)
	}
	return nil
}

func hostLimitsIntact(e *env) error {
	return e.checkLimits()
}

func hostDiskIntact(e *env) error {
	return e.checkDisk()
}

func hostInotifyOK(e *env) error {
	// The host's root must still be able to create inotify instances.
	fd, err := inotifyInit()
	if err != nil {
		return fmt.Errorf("host root cannot create inotify instances any more: %w", err)
	}
	return os.NewFile(uintptr(fd), "inotify").Close()
}
