package template

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
	"github.com/agentbox/agentbox/internal/errdefs"
)

// UnpackHook is `agentbox __hook unpack <spec>`: unpackArchive, confined.
// Image layers and uploaded build contexts are archives a tenant wrote;
// their decompression, tar parsing and file creation run in this child,
// never in the server:
//   - new mount, network, IPC and UTS namespaces (no network at all);
//   - limits on CPU time, address space, file size and descriptors;
//   - host uid 0 (the files keep the archive's numeric owners, which the
//     sandboxes' id maps rely on) with only CAP_CHOWN, CAP_FOWNER and
//     CAP_DAC_OVERRIDE: no CAP_SYS_ADMIN, no CAP_MKNOD (overlay whiteouts,
//     0/0 character devices, need none), so the trusted.overlay.opaque
//     markers are set by the server on the directories the child names;
//   - Landlock: writes only beneath the destination; the destination is
//     the child's root (chroot), so no host path can even be named;
//   - no_new_privs and a seccomp filter: no sockets, exec, ptrace,
//     chroot, mount or the other calls the container tier refuses.
//
// An identity-mapped user namespace was not used: trusted.* xattrs and
// chown to ids outside the map need capabilities in the host's namespace.
const UnpackHook = "unpack"

// unpackSpec is the hook's argument.
type unpackSpec struct {
	Limits UnpackLimits `json:"limits"`
}

// unpackResult is what the child writes on its standard output.
type unpackResult struct {
	Stats unpackStats `json:"stats"`
	// Error is the unpacker's refusal or failure; TooLarge says it wrapped
	// errdefs.ErrTooLarge.
	Error    string `json:"error,omitempty"`
	TooLarge bool   `json:"tooLarge,omitempty"`
}

// unpackChildEnv is set in the child's environment.
const unpackChildEnv = "AGENTBOX_UNPACK_CHILD"

// sealedFlag marks the second step of the hook (after the re-exec).
const sealedFlag = "sealed"

// unpackCaps are the capabilities the child keeps: numeric owners of any
// id, modes and times of files it made and chowned, entries in
// directories whose modes it already set.
var unpackCaps = []uintptr{unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_DAC_OVERRIDE}

// Resources of one unpack: decompression windows (zstd's is capped at 256
// MiB) and a tar reader need little memory; a 10 GiB layer takes minutes.
const (
	unpackCPUSeconds   = 1800
	unpackAddressSpace = 4 << 30
	unpackFiles        = 64
)

func unpackJail(lim UnpackLimits) confine.SelfJail {
	return confine.SelfJail{
		Writable: confine.FD(0),
		Keep:     unpackCaps,
		Limits: confine.Limits{
			CPUSeconds: unpackCPUSeconds, AddressSpace: unpackAddressSpace, Files: unpackFiles,
			// No one file is bigger than the whole budget.
			FileSize: uint64(lim.withDefaults().MaxBytes) + 1,
		},
	}
}

// confinedUnpack runs unpackArchive in `self __hook unpack`: the archive
// r on its standard input, dir (opened here, so a path swapped later does
// not matter) as descriptor 3. The result, the refusals included, is the
// in-process unpacker's: errors that wrapped errdefs.ErrTooLarge still do,
// with the same message.
func confinedUnpack(ctx context.Context, self string, r io.Reader, dir string, lim UnpackLimits) (unpackStats, error) {
	if self == "" {
		return unpackStats{}, errors.New("unpack: no binary to run the confined unpacker")
	}
	// A binary that does not dispatch the hook (a test binary without
	// TestMain) would run its own main as the child: never recursively.
	if os.Getenv(unpackChildEnv) != "" {
		return unpackStats{}, fmt.Errorf("unpack: %s did not run the %s hook but unpacks again", self, UnpackHook)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return unpackStats{}, fmt.Errorf("unpack: %w", err)
	}
	defer d.Close()
	b, err := json.Marshal(unpackSpec{Limits: lim})
	if err != nil {
		return unpackStats{}, err
	}
	cmd := exec.CommandContext(ctx, self, "__hook", UnpackHook, string(b))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", unpackChildEnv + "=1"}
	if v, ok := os.LookupEnv(confine.ProbeEnv); ok {
		cmd.Env = append(cmd.Env, confine.ProbeEnv+"="+v)
	}
	cmd.Dir = "/"
	cmd.Stdin = r
	out := &cappedBuffer{max: 64 << 20}
	diag := &cappedBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, diag
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
	err = cmd.Run()
	if cerr := ctx.Err(); cerr != nil {
		return unpackStats{}, cerr
	}
	if err != nil {
		return unpackStats{}, fmt.Errorf("unpack: the confined unpacker failed: %w: %s", err, confine.Output(diag.Bytes()))
	}
	var res unpackResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || out.over {
		return unpackStats{}, fmt.Errorf("unpack: the confined unpacker's result is unreadable (%d bytes): %v: %s", out.Len(), err, confine.Output(diag.Bytes()))
	}
	st := res.Stats
	opaque := st.Opaque
	st.Opaque = nil
	if res.Error != "" {
		if res.TooLarge {
			return st, fmt.Errorf("%s: %w", strings.TrimSuffix(res.Error, ": "+errdefs.ErrTooLarge.Error()), errdefs.ErrTooLarge)
		}
		return st, errors.New(res.Error)
	}
	if err := confine.MarkOpaque(dir, opaque, cleanEntryName); err != nil {
		return st, err
	}
	return st, nil
}

// RunUnpackHook is the child's side of confinedUnpack.
func RunUnpackHook(args []string) error { return runUnpackHook(args, sealedUnpack) }

// sealedUnpack is the child's work: the archive on standard input into
// its root, the destination.
func sealedUnpack(lim UnpackLimits) unpackResult {
	st, err := unpackArchiveTo(context.Background(), os.Stdin, "/", lim, true)
	res := unpackResult{Stats: st}
	if err != nil {
		res.Error, res.TooLarge = err.Error(), errors.Is(err, errdefs.ErrTooLarge)
	}
	return res
}

// runUnpackHook confines the process in two steps (confine.SelfJail) and
// then runs work, sealed, writing its result on standard output.
func runUnpackHook(args []string, work func(UnpackLimits) unpackResult) error {
	if len(args) == 0 || len(args) > 2 || (len(args) == 2 && args[1] != sealedFlag) {
		return fmt.Errorf("%s hook takes one argument", UnpackHook)
	}
	var sp unpackSpec
	if err := json.Unmarshal([]byte(args[0]), &sp); err != nil {
		return fmt.Errorf("%s hook: bad spec: %w", UnpackHook, err)
	}
	jail := unpackJail(sp.Limits)
	if len(args) == 1 {
		return jail.Prepare([]string{os.Args[0], "__hook", UnpackHook, args[0], sealedFlag})
	}
	if err := jail.Seal(3); err != nil {
		return err
	}
	b, err := json.Marshal(work(sp.Limits))
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(b)
	return err
}

// cappedBuffer keeps the first max bytes written to it and notes more.
type cappedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	room := c.max - c.Len()
	if len(p) > room {
		c.over = true
		p = p[:max(room, 0)]
	}
	c.Buffer.Write(p)
	return n, nil
}
