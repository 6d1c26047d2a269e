// Package confine runs a host tool on data a tenant wrote (a guest's disk
// image) without giving the tool's parser the host: the tool runs as an
// unprivileged uid, in new network, mount, IPC and UTS namespaces, under
// resource limits, Landlock (system files read-only, the named files and
// nothing else writable) and a seccomp filter (no sockets, no new
// processes, none of the calls the container tier refuses). A bug in
// e2fsck or debugfs that a crafted image triggers, or in mkfs.ext4 that a
// crafted template tree triggers, then yields a process that can do
// nothing but write the image it was given.
//
// The confinement is applied by the server's own binary in the child
// (`agentbox __hook confine <spec>`), which then execs the tool.
package confine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Hook is the name of the __hook that confines itself and execs the tool.
const Hook = "confine"

// Limits bound the tool's resources (0 keeps the default).
type Limits struct {
	CPUSeconds   uint64 `json:"cpu,omitempty"`
	AddressSpace uint64 `json:"as,omitempty"`
	FileSize     uint64 `json:"fsize,omitempty"`
	Files        uint64 `json:"nofile,omitempty"`
}

// Defaults for Limits' zero fields: generous for e2fsck on a guest disk of
// a few GiB, small for anything a crafted image could make it do.
const (
	defaultCPUSeconds   = 120
	defaultAddressSpace = 2 << 30
	defaultFiles        = 64
)

// Tool is one run of a host tool on files the server opened for it.
type Tool struct {
	// Self is the server's binary, which applies the confinement.
	Self string
	// UID and GID are the unprivileged host ids the tool runs as; the
	// files it writes must be theirs (the tool reopens them by
	// /proc/self/fd/N, which checks their owner and mode).
	UID, GID int
	// Argv is the tool's command line, its absolute path first; it names
	// Files[i] as FD(i).
	Argv []string
	// Files are passed as descriptors 3, 4, ...: the only data files the
	// tool may read or write (Landlock rules on the descriptors' inodes,
	// so unlinked files work too).
	Files []*os.File
	// Dirs are directory trees the tool may read and never write (a tree
	// mkfs copies), passed as descriptors after Files: the tool names
	// Dirs[i] as FD(len(Files)+i).
	Dirs []*os.File
	// ReadAll lets the tool read every file under Dirs whatever its owner
	// and mode (CAP_DAC_READ_SEARCH, kept across the exec as an ambient
	// capability and the only one it has): a copier of a tree of many
	// owners needs it. Landlock still keeps it to the system dirs, Dirs
	// and Files.
	ReadAll bool
	// Stdin is the tool's standard input (nil: none).
	Stdin io.Reader
	// Limits bound CPU, memory, file size and descriptors.
	Limits Limits
}

// FD is the name by which the tool opens Files[i].
func FD(i int) string { return fmt.Sprintf("/proc/self/fd/%d", 3+i) }

// spec is what the hook receives.
type spec struct {
	Argv  []string `json:"argv"`
	Files int      `json:"files"` // how many descriptors were passed
	Dirs  int      `json:"dirs,omitempty"`
	// ReadAll keeps CAP_DAC_READ_SEARCH (Tool.ReadAll).
	ReadAll bool   `json:"readAll,omitempty"`
	UID     int    `json:"uid"`
	GID     int    `json:"gid"`
	Limits  Limits `json:"limits"`
}

// maxOutput caps what Run keeps of the tool's output.
const maxOutput = 64 << 10

// Run runs the tool confined and returns its output (standard output and
// error, at most 64 KiB); a failure's error carries its exit status.
func (t Tool) Run(ctx context.Context) ([]byte, error) {
	if t.UID <= 0 || t.GID <= 0 {
		return nil, fmt.Errorf("confine: %s: an unprivileged uid and gid are required, not %d:%d", filepath.Base(firstOr(t.Argv)), t.UID, t.GID)
	}
	if len(t.Argv) == 0 || !filepath.IsAbs(t.Argv[0]) {
		return nil, fmt.Errorf("confine: Argv must start with an absolute path, not %q", firstOr(t.Argv))
	}
	sp := spec{Argv: t.Argv, Files: len(t.Files), Dirs: len(t.Dirs), ReadAll: t.ReadAll, UID: t.UID, GID: t.GID, Limits: t.Limits}
	b, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, t.Self, "__hook", Hook, string(b))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.Dir = "/"
	cmd.Stdin = t.Stdin
	out := &Capped{Max: maxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = append(slices.Clone(t.Files), t.Dirs...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
	err = cmd.Run()
	return out.Bytes(), err
}

// Output is a tool's output for an error message: trimmed, one line.
func Output(b []byte) string {
	return strings.Join(strings.Fields(strings.TrimSpace(string(b))), " ")
}

func firstOr(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}

// Capped keeps the first Max bytes written to it and notes (Over) that
// more came: a confined child's output, which the server reads whole and
// must not let the child grow without bound.
type Capped struct {
	bytes.Buffer
	Max  int
	Over bool
}

// Write keeps what fits and never fails, so the child is never stopped by
// a full pipe.
func (c *Capped) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.Max - c.Len(); n > room {
		c.Over = true
		p = p[:max(room, 0)]
	}
	c.Buffer.Write(p)
	return n, nil
}

// errBadSpec is a hook argument the server did not make.
var errBadSpec = errors.New("confine: bad spec")
