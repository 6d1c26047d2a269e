package untar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/confine"
)

// Unpacker is one confined entry point: `agentbox __hook <Hook> <limits>`
// unpacks its standard input into descriptor 3 in a child confined as
// follows (confine.SelfJail, in two steps: Prepare, a re-exec, Seal):
//   - new mount, network, IPC and UTS namespaces (no network at all);
//   - limits on CPU time, address space, file size (the largest file the
//     limits allow) and descriptors;
//   - host uid 0, because the files keep the stream's numeric owners
//     (which the sandboxes' id maps rely on), with only the capabilities
//     in Keep: never CAP_SYS_ADMIN or CAP_MKNOD, so overlay opaque markers
//     (trusted.* xattrs) are set by the server on the directories the
//     child names, and no device but a 0/0 whiteout can be made;
//   - Landlock (one layer, refer allowed for hard links) that writes only
//     beneath the destination, which is also the child's root (chroot),
//     so no host path can even be named;
//   - no_new_privs and a seccomp filter: no sockets, exec, ptrace,
//     chroot, mount or the other calls the container tier refuses.
//
// An identity-mapped user namespace was not used: trusted.* xattrs and
// chown to ids outside the map need capabilities in the host's namespace.
type Unpacker struct {
	// Hook is the __hook name; the binary's dispatch of it calls Serve.
	Hook string
	// Keep are the capabilities the child keeps.
	Keep []uintptr
	// Defaults fill the limits' zero fields (Limits.Or), on both sides.
	Defaults Limits
	// Refusal is what the entry point's refusals wrap (errors.Is holds
	// for them after the trip from the child, with the same message).
	Refusal error
	// Clean checks a directory the child asks to mark opaque as the entry
	// point's unpacker checks entry names; a name it refuses fails the
	// unpack with confine.ErrNamedOutside.
	Clean func(string) (string, bool)
}

// Work is the sealed child's unpack of r into root (its own root, the
// destination) within lim (defaults applied). It returns the directories
// that want an opaque marker, and a value for the caller (JSON-encoded;
// nil for none), which reaches it also when err is not nil.
type Work func(ctx context.Context, r io.Reader, root string, lim Limits) (opaque []string, payload any, err error)

// result is what the child writes on its standard output.
type result struct {
	Opaque  []string        `json:"opaque,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   string          `json:"error,omitempty"`
	// Refused says Error wrapped the Unpacker's Refusal.
	Refused bool `json:"refused,omitempty"`
}

// childEnv marks the child, so that a binary that does not dispatch the
// hook (a test binary without TestMain) never unpacks recursively.
const childEnv = "AGENTBOX_UNPACK_CHILD"

// sealedArg marks the hook's second step, after the re-exec.
const sealedArg = "sealed"

// Resources of one unpack: a decompression window (zstd's is capped at
// 256 MiB) and a tar reader need little memory; a large layer or a
// snapshot's sparse disk copy takes minutes of CPU.
const (
	cpuSeconds   = 3600
	addressSpace = 4 << 30
	files        = 64
)

// Output caps: the result holds a list of directories and a payload; the
// diagnostics are an error message.
const (
	maxResult = 64 << 20
	maxDiag   = 16 << 10
)

func (u Unpacker) jail(lim Limits) confine.SelfJail {
	l := confine.Limits{CPUSeconds: cpuSeconds, AddressSpace: addressSpace, Files: files}
	if n := lim.FileSize(); n > 0 {
		l.FileSize = uint64(n) + 1
	}
	return confine.SelfJail{Writable: confine.FD(0), Keep: u.Keep, Limits: l}
}

// Run unpacks r into dir (opened here, so a path swapped later does not
// matter) in `self __hook <Hook>`, decodes the child's payload into
// payload (a pointer, or nil) and then sets the opaque markers the child
// named. A refusal keeps its message and wraps Refusal.
func (u Unpacker) Run(ctx context.Context, self string, r io.Reader, dir string, lim Limits, payload any) error {
	if self == "" {
		return errors.New("unpack: no binary to run the confined unpacker")
	}
	if os.Getenv(childEnv) != "" {
		return fmt.Errorf("unpack: %s did not run the %s hook but unpacks again", self, u.Hook)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	defer d.Close()
	b, err := json.Marshal(lim.Or(u.Defaults))
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "__hook", u.Hook, string(b))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", childEnv + "=1"}
	if v, ok := os.LookupEnv(confine.ProbeEnv); ok {
		cmd.Env = append(cmd.Env, confine.ProbeEnv+"="+v)
	}
	cmd.Dir = "/"
	cmd.Stdin = r
	out, diag := &confine.Capped{Max: maxResult}, &confine.Capped{Max: maxDiag}
	cmd.Stdout, cmd.Stderr = out, diag
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
	err = cmd.Run()
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("unpack: the confined unpacker failed: %w: %s", err, confine.Output(diag.Bytes()))
	}
	var res result
	err = json.Unmarshal(out.Bytes(), &res)
	if err == nil && payload != nil && len(res.Payload) > 0 {
		err = json.Unmarshal(res.Payload, payload)
	}
	if err != nil || out.Over {
		return fmt.Errorf("unpack: the confined unpacker's result is unreadable (%d bytes): %v: %s", out.Len(), err, confine.Output(diag.Bytes()))
	}
	if res.Error != "" {
		if res.Refused && u.Refusal != nil {
			return fmt.Errorf("%s: %w", strings.TrimSuffix(res.Error, ": "+u.Refusal.Error()), u.Refusal)
		}
		return errors.New(res.Error)
	}
	clean := u.Clean
	if clean == nil {
		clean = func(string) (string, bool) { return "", false }
	}
	if err := confine.MarkOpaque(dir, res.Opaque, clean); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	return nil
}

// Serve is the child's side of Run (`__hook <Hook> <limits> [sealed]`):
// it confines the process in two steps, then runs work on standard input
// into its root and writes the result on standard output. It returns only
// on failure before the result.
func (u Unpacker) Serve(args []string, work Work) error {
	if len(args) == 0 || len(args) > 2 || (len(args) == 2 && args[1] != sealedArg) {
		return fmt.Errorf("%s hook takes one argument", u.Hook)
	}
	var lim Limits
	if err := json.Unmarshal([]byte(args[0]), &lim); err != nil {
		return fmt.Errorf("%s hook: bad limits: %w", u.Hook, err)
	}
	lim = lim.Or(u.Defaults)
	jail := u.jail(lim)
	if len(args) == 1 {
		return jail.Prepare([]string{os.Args[0], "__hook", u.Hook, args[0], sealedArg})
	}
	if err := jail.Seal(3); err != nil {
		return err
	}
	opaque, payload, err := work(context.Background(), os.Stdin, "/", lim)
	res := result{Opaque: opaque}
	if err != nil {
		res = result{Error: err.Error(), Refused: u.Refusal != nil && errors.Is(err, u.Refusal)}
	}
	if payload != nil {
		if res.Payload, err = json.Marshal(payload); err != nil {
			return fmt.Errorf("%s hook: result: %w", u.Hook, err)
		}
	}
	b, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("%s hook: result: %w", u.Hook, err)
	}
	_, err = os.Stdout.Write(b)
	return err
}
