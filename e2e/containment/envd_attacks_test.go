package containment

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// envdHijack attacks envd as sandbox root: ptrace attach and seize,
// /proc/<pid>/mem and fd/0, and process_vm_readv against PID 1 (envd is
// init and server in one process); the command's own reaper holds no
// secret and stays dumpable. Contained when every attempt is refused.
const envdHijack = `grep -qx 'envd' /proc/1/comm || { echo "PID 1 is $(cat /proc/1/comm), not envd"; exit 2; }
python3 - 1 <<'EOF'
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.syscall.restype = ctypes.c_long
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
crossed = []
for p in sys.argv[1:]:
    pid = int(p)
    for req, name in ((16, "PTRACE_ATTACH"), (0x4206, "PTRACE_SEIZE")):
        if libc.ptrace(ctypes.c_long(req), ctypes.c_long(pid), None, None) == 0:
            crossed.append("%s %d" % (name, pid))
            libc.ptrace(ctypes.c_long(17), ctypes.c_long(pid), None, None)
    # environ and maps stay readable to same-uid root on this kernel; they
    # hold no secret (the token arrives over /init, into memory only).
    for f in ("mem", "fd/0"):
        try:
            open("/proc/%d/%s" % (pid, f), "rb").close()
            crossed.append("opened /proc/%d/%s" % (pid, f))
        except OSError:
            pass
    buf = ctypes.create_string_buffer(16)
    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 16)
    remote = iovec(0x400000, 16)  # a static Go binary's text
    r = libc.syscall(310, ctypes.c_long(pid), ctypes.byref(local), ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    e = ctypes.get_errno()
    if r >= 0 or e != errno.EPERM:
        crossed.append("process_vm_readv %d -> %d %s" % (pid, r, errno.errorcode.get(e, e)))
print("pids", sys.argv[1:], "crossed:", crossed or "none")
sys.exit(1 if crossed else 0)
EOF`

// initFromInside posts /init to envd from inside the sandbox, on loopback
// and on the sandbox's own address, to lift the command lifetime cap.
const initFromInside = `body='{"maxCommandSeconds":999999}'
for ip in 127.0.0.1 $(hostname -I); do
  line=$(exec 3<>/dev/tcp/$ip/49983 && printf 'POST /init HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' ${#body} "$body" >&3 && head -1 <&3)
  echo "$ip: $line"
  case "$line" in *" 403 "*) ;; *) exit 1 ;; esac
done`

func envdAttacks() []attack {
	return []attack{
		{name: "ptrace or read envd's memory", script: envdHijack},
		{name: "ptrace envd after pause and resume", api: envdAfterResume},
		{name: "/init from inside the sandbox", script: initFromInside},
		{name: "setsid escape from the command lifetime cap", api: capEscape},
	}
}

// envdAfterResume pauses a fresh sandbox to a memory image and resumes it,
// then attacks envd as in envdHijack: CRIU must restore envd non-dumpable.
func envdAfterResume(ctx context.Context, e *env) error {
	sb, _, err := e.create(ctx, attackerLimits)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer e.client.Kill(context.WithoutCancel(ctx), sb.ID)
	if st, err := e.srv.api(ctx, http.MethodPost, "/sandboxes/"+sb.ID+"/pause", map[string]any{}, nil); err != nil {
		return fmt.Errorf("pause: %d %w", st, err)
	}
	sb, err = e.client.Connect(ctx, sb.ID, 0)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	res, err := sb.Commands.Run(ctx, envdHijack, agentbox.WithUser("root"), agentbox.WithTimeout(60*time.Second))
	if err != nil {
		return fmt.Errorf("after resume: %v", err)
	}
	if !strings.Contains(res.Stdout, "crossed: none") {
		return fmt.Errorf("after resume: %s", res.Stdout)
	}
	return nil
}

// capEscape starts, in a sandbox whose command lifetime cap is 2 s,
// processes that leave the command's process group (setsid, double fork),
// once with the command still running at the cap and once with the command
// returned right away, then looks for survivors after the cap.
func capEscape(ctx context.Context, e *env) error {
	lim := maps.Clone(attackerLimits)
	lim["maxCommandSeconds"] = 2
	sb, _, err := e.create(ctx, lim)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer e.client.Kill(context.WithoutCancel(ctx), sb.ID)
	root := agentbox.WithUser("root")
	escape := `setsid sleep 1000 >/dev/null 2>&1 & ( sleep 1001 >/dev/null 2>&1 & ) ; ( setsid sh -c 'sleep 1002 & exit' >/dev/null 2>&1 & ) ;`
	if _, err := sb.Commands.Run(ctx, escape+" sleep 600", root, agentbox.WithTimeout(60*time.Second)); err == nil {
		return fmt.Errorf("a command outlived its 2 s cap")
	}
	if _, err := sb.Commands.Run(ctx, strings.ReplaceAll(escape, "100", "200")+" true", root); err != nil {
		return fmt.Errorf("a command that returns at once: %v", err)
	}
	// The cap's kill lands within moments of the 2 s on an idle host and
	// later on a loaded one: wait for the survivors to go, and call any
	// that outlive the cap by far an escape.
	left := ""
	for deadline := time.Now().Add(30 * time.Second); ; {
		res, err := sb.Commands.Run(ctx, `pgrep -a -x sleep || true`, root)
		if err != nil {
			return err
		}
		if left = strings.TrimSpace(res.Stdout); left == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left running 30 s after the cap: %s", strings.ReplaceAll(left, "\n", "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
