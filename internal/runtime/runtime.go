// Package runtime defines how agentbox runs one sandbox as an isolated
// container. Drivers (runc, runsc; a microVM later) implement Runtime and
// register as tiers (tiers.go); the sandbox manager talks to the registry.
package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"
)

// EnvdPathInSandbox is where the envd binary is bind-mounted (read-only) in
// every sandbox. envd runs as the container's init (PID 1).
const EnvdPathInSandbox = "/.agentbox/bin/envd"

// UserCgroup is the child of a sandbox's cgroup that holds everything envd
// starts for the user, with lower limits than the sandbox's, so envd keeps
// a reserve of pids and memory (bundle/usercgroup.go). On cgroup v2 envd
// itself sits in the sibling EnvdCgroup.
const (
	UserCgroup = "user"
	EnvdCgroup = "envd"
)

// Resources are the cgroup limits of one sandbox.
type Resources struct {
	CPUCount int // whole CPUs (CFS quota = CPUCount * period); 0 = unlimited
	MemoryMB int // hard memory limit in MiB (swap is not allowed beyond it); 0 = unlimited
	PIDs     int // max number of tasks; 0 = unlimited
	DiskMB   int // size of the writable layer in MiB, enforced where the driver can; 0 = unlimited
	TmpMB    int // size of the tmpfs on /tmp in MiB (counted as memory); 0 = /tmp is on the writable layer
}

// Spec describes the sandbox to start.
type Spec struct {
	ID        string    // sandbox id: container id and hostname
	Layers    []string  // template rootfs directories, lowest first; shared, never written
	NetNSPath string    // network namespace to join (made by the network package)
	DNS       []string  // nameservers written to the sandbox's /etc/resolv.conf
	Resources Resources // cgroup limits
	Runtime   string    // OCI runtime tier; "" means the driver's default
	// BootID is what the sandbox reads in /proc/sys/kernel/random/boot_id
	// on a fresh boot ("" lets the tier choose); memory restores keep the
	// one in their image.
	BootID string
	// Volumes are mounted read-write into the sandbox, in order.
	Volumes []VolumeMount
}

// VolumeMount is a team volume mounted into a sandbox. Its files are stored
// with the ids the sandbox sees (0..65535, canonical); a sandbox in a user
// namespace of its own sees them through an idmapped mount into its range,
// so every sandbox sharing a volume sees the same owners.
type VolumeMount struct {
	Source string // host directory: the root of the volume's filesystem
	Path   string // absolute mount point inside the sandbox
}

// Status is the lifecycle state the runtime observes.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped" // exists but its init exited
)

// Stats are point-in-time resource figures read from the cgroup and disk.
type Stats struct {
	Timestamp     time.Time
	CPUUsageNanos uint64 // cumulative CPU time of all tasks
	MemoryUsed    uint64 // bytes, excluding page cache
	MemoryCache   uint64 // bytes of page cache
	MemoryLimit   uint64 // bytes
	DiskUsed      uint64 // bytes written to the sandbox's writable layer
	DiskTotal     uint64 // bytes available to the writable layer
}

// Runtime runs sandboxes. Implementations must be safe for concurrent use and
// must survive a restart of the server process: containers keep running and
// State/Delete/List work on what an earlier process created.
type Runtime interface {
	// Create builds the bundle (overlay rootfs over Layers, cgroups, mounts),
	// starts envd as init and returns once the container runs. On error it
	// leaves nothing behind.
	Create(ctx context.Context, spec Spec) error
	// Delete stops the container and removes everything Create made: container
	// state, overlay mount, writable layer, cgroups. Deleting an unknown id is
	// not an error.
	Delete(ctx context.Context, id string) error
	// State reports the container's state; errdefs.ErrNotFound if unknown.
	State(ctx context.Context, id string) (Status, error)
	// Stats reads live resource usage.
	Stats(ctx context.Context, id string) (Stats, error)
	// List returns the ids of every sandbox this runtime has state for,
	// including half-created ones, so the manager can reconcile after a crash.
	List(ctx context.Context) ([]string, error)
}

// CheckpointOptions tune Checkpointer.Checkpoint.
type CheckpointOptions struct {
	// ImageDir receives the memory image; "" means the sandbox's own pause
	// image, which Restore with an empty ImageDir resumes from.
	ImageDir string
	// LeaveRunning keeps the sandbox running (snapshots, forks); otherwise
	// its processes are gone once Checkpoint returns and it holds no CPU or RAM.
	LeaveRunning bool
	// UpperCopy, if set, receives a copy of the writable layer taken while
	// the processes are stopped, so files and memory match exactly.
	UpperCopy string
	// FilesystemOnly keeps no memory: the processes are stopped (killed, or
	// only frozen while UpperCopy is taken with LeaveRunning) and the image
	// is a marker that Restore boots the sandbox fresh from its layers and
	// writable layer. Unflushed writes may be lost, as on a crash.
	FilesystemOnly bool
}

// RestoreOptions tune Checkpointer.Restore.
type RestoreOptions struct {
	// ImageDir is the image to restore; "" means the sandbox's own pause image.
	ImageDir string
	// NewNetwork says the image is restored into another network namespace
	// (a fork or a snapshot): its established TCP connections are closed.
	NewNetwork bool
	// FilesystemOnly boots the sandbox fresh (envd as a new init) on its
	// layers and writable layer, ignoring any memory in the image, which is
	// left untouched.
	FilesystemOnly bool
	// Lazy chooses whether a resume starts the sandbox before its memory
	// is loaded (drivers that can; the default decides by image size).
	Lazy Lazy
}

// Lazy is RestoreOptions.Lazy.
type Lazy int

const (
	LazyAuto   Lazy = iota // the driver's rule (by image size)
	LazyAlways             // whenever the host can
	LazyNever              // load all memory before the sandbox runs
)

// Optional capabilities. A driver implements those it has; the manager
// asks with a type assertion on these interfaces (never an anonymous one)
// and tells the client what is missing.

// Freezer stops every process of a sandbox in place (cgroup freezer) and
// resumes them; memory stays resident.
type Freezer interface {
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
}

// CheckpointProber says whether this host can checkpoint at all (a driver
// may implement Checkpointer yet lack the tool it needs, e.g. CRIU).
type CheckpointProber interface {
	CheckpointSupported() error
}

// TierChecker says whether a runtime tier can run sandboxes here; the
// error says how to make it available.
type TierChecker interface {
	TierAvailable(tier string) error
}

// SandboxResolver attributes kernel records (seccomp audit events) to a
// sandbox: by audit session, and by the name of its cgroup directory.
type SandboxResolver interface {
	SandboxOfSession(ses uint32) (string, bool)
	SandboxOfCgroup(name string) (string, bool)
}

// Checkpointer is implemented by drivers that can stop a sandbox with its
// memory and bring it back (pause/resume, snapshots, forks) and freeze it in
// place. The manager type-asserts it; drivers without it cannot pause.
type Checkpointer interface {
	// Checkpoint dumps the sandbox's processes to an image.
	Checkpoint(ctx context.Context, id string, opts CheckpointOptions) error
	// Restore starts sandbox spec.ID from an image: in place when its bundle
	// exists (resume), else in a new bundle built from spec (spec.Layers then
	// end with the writable layer captured at checkpoint time).
	Restore(ctx context.Context, spec Spec, opts RestoreOptions) error
	// HasCheckpoint reports whether a complete pause image of id exists,
	// finishing the bookkeeping of a checkpoint interrupted by a crash.
	HasCheckpoint(ctx context.Context, id string) (bool, error)
	// DropCheckpoint removes the pause image of id (after a resume).
	DropCheckpoint(ctx context.Context, id string) error
	// A checkpointing driver freezes too: snapshots freeze the sandbox
	// while its writable layer is copied.
	Freezer
}

// NetPlugger is the network side of sandboxes whose netns the runtime
// makes (network.Manager implements it).
type NetPlugger interface {
	// Plug pins and configures the netns of process pid (0: make one in
	// the host's user namespace) as sandbox id's.
	Plug(ctx context.Context, id string, pid int) error
	// Unplug lets go of the netns of a sandbox whose processes are gone.
	Unplug(ctx context.Context, id string) error
}

// NewBootID returns a random version 4 UUID, the shape of the kernel's
// /proc/sys/kernel/random/boot_id: a new one names each fresh boot.
func NewBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
