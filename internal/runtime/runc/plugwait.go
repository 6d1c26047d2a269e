package runc

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// A restore's netns is wired up by the server itself, at the moment runc
// runs the prestart hooks (CRIU has made the namespaces, the sockets are not
// back yet): the hook, `agentbox __hook plug-wait --socket <path>`, hands
// the server the OCI state runc gives it (the restored init's pid) over a
// socket in the bundle and waits for the answer. internal/runtime/nsjoin
// runs the hook without starting the Go runtime, so each restore costs one
// short exec instead of a start of the whole binary doing netlink (about
// 20 ms of CPU).

// PlugWaitHook names the restore's network hook.
const PlugWaitHook = "plug-wait"

// plugSocket is the socket plug-wait reaches the server on, in the bundle.
const plugSocket = "plug.sock"

// plugHookTimeout is how long runc lets the hook run, and the server wait
// for it.
const plugHookTimeout = 30 * time.Second

// plugWait is the server's end of one restore's plug-wait hook.
type plugWait struct {
	ln   *net.UnixListener
	path string
	dir  *os.File // the bundle, when path is too long for a socket address
	done chan plugResult
}

// plugResult is what the hook's request came to: the pid it named and
// whether the netns of that pid was plugged.
type plugResult struct {
	pid int
	err error
}

// listenPlug listens on the bundle in dir's plug socket for the hook of the
// next restore, and plugs the netns of the pid it names with plug.
func listenPlug(ctx context.Context, dir string, plug func(ctx context.Context, pid int) error) (*plugWait, error) {
	path := filepath.Join(dir, plugSocket)
	_ = os.Remove(path)
	w := &plugWait{path: path, done: make(chan plugResult, 1)}
	addr := path
	if len(addr) >= len(unix.RawSockaddrUnix{}.Path) {
		d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("plug socket: %w", err)
		}
		w.dir = d
		addr = "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + plugSocket
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		w.close()
		return nil, fmt.Errorf("plug socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // addr may name a descriptor; close removes path
	w.ln = ln
	if err := os.Chmod(path, 0o600); err != nil {
		w.close()
		return nil, fmt.Errorf("plug socket: %w", err)
	}
	_ = ln.SetDeadline(time.Now().Add(plugHookTimeout))
	go w.serve(ctx, plug)
	return w, nil
}

// serve answers the first request of the host's root: anyone else who
// reaches the socket is turned away.
func (w *plugWait) serve(ctx context.Context, plug func(ctx context.Context, pid int) error) {
	for {
		c, err := w.ln.AcceptUnix()
		if err != nil {
			return // closed, or the hook never came
		}
		if uid, err := peerUID(c); err != nil || uid != 0 {
			_ = c.Close()
			continue
		}
		_ = c.SetDeadline(time.Now().Add(plugHookTimeout))
		var st struct {
			Pid int `json:"pid"`
		}
		r := plugResult{}
		if err := json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&st); err != nil {
			r.err = fmt.Errorf("OCI state: %w", err)
		} else if st.Pid <= 0 {
			r.err = errors.New("the OCI state names no pid")
		} else {
			r.pid, r.err = st.Pid, plug(ctx, st.Pid)
		}
		// The result is in before the hook hears it, so the restore that
		// waits on the hook finds it.
		w.done <- r
		answer := "ok"
		if r.err != nil {
			answer = r.err.Error()
		}
		_, _ = io.WriteString(c, answer)
		_ = c.Close()
		return
	}
}

// result returns what the hook came to, once the restore has returned
// (ok false: the hook did not reach the server).
func (w *plugWait) result() (plugResult, bool) {
	select {
	case r := <-w.done:
		return r, true
	default:
		return plugResult{}, false
	}
}

// close stops listening and removes the socket.
func (w *plugWait) close() {
	if w.ln != nil {
		_ = w.ln.Close()
	}
	_ = os.Remove(w.path)
	if w.dir != nil {
		_ = w.dir.Close()
	}
}

// peerUID is the user id of the process at the other end of c.
func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// RunPlugWaitHook is the Go side of `agentbox __hook plug-wait --socket
// <path>`, whose work (sending the OCI state on stdin to the server at the
// socket and failing unless it answers "ok") internal/runtime/nsjoin's
// constructor does without the Go runtime. It is reached only with other
// arguments, and names what is wrong.
func RunPlugWaitHook(args []string) error {
	fs := flag.NewFlagSet(PlugWaitHook, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("socket", "", "")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s hook: %w", PlugWaitHook, err)
	}
	if *path == "" || fs.NArg() > 0 {
		return fmt.Errorf("%s hook: want --socket <path> and nothing else, got %q", PlugWaitHook, args)
	}
	return notRun(PlugWaitHook, args)
}
