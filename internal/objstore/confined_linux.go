package objstore

import (
	"bytes"
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

// UnpackHook is `agentbox __hook image-unpack <limits>`: Unpack of an
// image from standard input into descriptor 3, in a child confined like
// the template unpacker's: new mount, network, IPC and UTS namespaces;
// CPU, memory, file size and descriptor limits; host root with only
// CAP_CHOWN, CAP_FOWNER, CAP_DAC_OVERRIDE, CAP_FSETID (the layer's owners,
// modes and set-id bits) and CAP_SETFCAP (namespaced file capabilities);
// Landlock and a chroot into the destination; no_new_privs and seccomp (no
// sockets, exec, ptrace, chroot, mount). Overlay opaque markers (trusted.*,
// which would need CAP_SYS_ADMIN) are set by the server on the directories
// the child names. A user namespace was not used: the layer holds files
// of every uid of the sandbox's range and root's, and trusted.* markers.
const UnpackHook = "image-unpack"

// unpackCaps are the capabilities the child keeps.
var unpackCaps = []uintptr{unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_SETFCAP}

// unpackResult is what the child writes on its standard output.
type unpackResult struct {
	Opaque []string `json:"opaque,omitempty"`
	Error  string   `json:"error,omitempty"`
	// Unsafe says the error wrapped ErrUnsafeImage.
	Unsafe bool `json:"unsafe,omitempty"`
}

// childEnv marks the child, so that a binary that does not dispatch the
// hook never unpacks recursively.
const childEnv = "AGENTBOX_IMAGE_UNPACK_CHILD"

const sealedArg = "sealed"

func unpackJail(lim UnpackLimits) confine.SelfJail {
	return confine.SelfJail{
		Writable: confine.FD(0),
		Keep:     unpackCaps,
		Limits: confine.Limits{
			CPUSeconds: 3600, AddressSpace: 4 << 30, Files: 64,
			FileSize: uint64(lim.withDefaults().MaxEntryBytes) + 1,
		},
	}
}

// unpackConfined runs Unpack of r into dir in `self __hook image-unpack`,
// then sets the opaque markers the child named. Refusals wrap
// ErrUnsafeImage as Unpack's do, with the same message.
func unpackConfined(ctx context.Context, self string, r io.Reader, dir string, lim UnpackLimits) error {
	if os.Getenv(childEnv) != "" {
		return fmt.Errorf("unpack: %s did not run the %s hook but unpacks again", self, UnpackHook)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	defer d.Close()
	b, err := json.Marshal(lim)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "__hook", UnpackHook, string(b))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", childEnv + "=1"}
	cmd.Dir = "/"
	cmd.Stdin = r
	var out, diag bytes.Buffer
	cmd.Stdout = &limitedBuffer{b: &out, max: 16 << 20}
	cmd.Stderr = &limitedBuffer{b: &diag, max: 16 << 10}
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
	var res unpackResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return fmt.Errorf("unpack: the confined unpacker's result is unreadable: %w: %s", err, confine.Output(diag.Bytes()))
	}
	if res.Error != "" {
		if res.Unsafe {
			return fmt.Errorf("%s: %w", strings.TrimSuffix(res.Error, ": "+ErrUnsafeImage.Error()), ErrUnsafeImage)
		}
		return errors.New(res.Error)
	}
	if err := confine.MarkOpaque(dir, res.Opaque, func(n string) (string, bool) {
		name, ok := cleanName(n)
		return name, ok && name != "." // the image's root is never opaque
	}); err != nil {
		if errors.Is(err, confine.ErrNamedOutside) {
			return fmt.Errorf("unpack: %w: %w", err, ErrUnsafeImage)
		}
		return err
	}
	return nil
}

// RunUnpackHook is the child's side of unpackConfined: confine (two
// steps, confine.SelfJail), unpack standard input into the root, write
// the result.
func RunUnpackHook(args []string) error {
	if len(args) == 0 || len(args) > 2 || (len(args) == 2 && args[1] != sealedArg) {
		return fmt.Errorf("%s hook takes one argument", UnpackHook)
	}
	var lim UnpackLimits
	if err := json.Unmarshal([]byte(args[0]), &lim); err != nil {
		return fmt.Errorf("%s hook: bad limits: %w", UnpackHook, err)
	}
	jail := unpackJail(lim)
	if len(args) == 1 {
		return jail.Prepare([]string{os.Args[0], "__hook", UnpackHook, args[0], sealedArg})
	}
	if err := jail.Seal(3); err != nil {
		return err
	}
	opaque, err := unpack(context.Background(), os.Stdin, "/", lim, true)
	res := unpackResult{Opaque: opaque}
	if err != nil {
		res = unpackResult{Error: err.Error(), Unsafe: errors.Is(err, ErrUnsafeImage)}
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(b)
	return err
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
