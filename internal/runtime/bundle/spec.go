package bundle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/runtime"
)

// logDirInSandbox is where the sandbox's log directory (on the host,
// outside the writable layer) is mounted; envd writes its log there.
const logDirInSandbox = "/.agentbox/log"

// capabilities is Docker's default set: enough for package managers and
// sudo inside the sandbox, nothing that reaches the host kernel's controls.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

func ptr[T any](v T) *T { return &v }

// charDevice describes one of the default device nodes and its cgroup rule.
func charDevice(path string, major, minor int64) (specs.LinuxDevice, specs.LinuxDeviceCgroup) {
	mode := os.FileMode(0o666)
	return specs.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor, FileMode: &mode, UID: ptr(uint32(0)), GID: ptr(uint32(0))},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(major), Minor: ptr(minor), Access: "rwm"}
}

// OCISpec builds the config.json of sandbox spec.ID's bundle in dir, before
// hardening; base is the first host id of its user namespace's range (with
// o.UserNS).
func (s *Store) OCISpec(spec runtime.Spec, dir string, o Options, base uint32) *specs.Spec {
	var devices []specs.LinuxDevice
	rules := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	for _, d := range []struct {
		path         string
		major, minor int64
	}{
		{"/dev/null", 1, 3}, {"/dev/zero", 1, 5}, {"/dev/full", 1, 7},
		{"/dev/random", 1, 8}, {"/dev/urandom", 1, 9}, {"/dev/tty", 5, 0},
	} {
		dev, rule := charDevice(d.path, d.major, d.minor)
		devices = append(devices, dev)
		rules = append(rules, rule)
	}
	// /dev/ptmx (a symlink runc makes to pts/ptmx) and the pts slaves.
	rules = append(rules,
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(int64(5)), Minor: ptr(int64(2)), Access: "rwm"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(int64(136)), Access: "rwm"},
	)

	res := &specs.LinuxResources{Devices: rules, CPU: &specs.LinuxCPU{Shares: ptr(uint64(1024))}}
	if mb := spec.Resources.MemoryMB; mb > 0 {
		limit := int64(mb) << 20
		res.Memory = &specs.LinuxMemory{Limit: ptr(limit), Swap: ptr(limit)}
	}
	if n := spec.Resources.PIDs; n > 0 {
		res.Pids = &specs.LinuxPids{Limit: ptr(int64(n))}
	}
	if n := spec.Resources.CPUCount; n > 0 {
		res.CPU.Quota = ptr(int64(n) * 100000)
		res.CPU.Period = ptr(uint64(100000))
	}

	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetNSPath}
	if o.OwnNet {
		netns.Path = "" // made with the user namespace, handed to Net.Plug
	}
	bindRO := []string{"bind", "ro", "nosuid", "nodev"}
	view := viewRoot(dir) // the files below are bound from it
	var annotations map[string]string
	if mb := spec.Resources.DiskMB; mb > 0 {
		annotations = map[string]string{annotationDiskMB: fmt.Sprint(mb)}
	}
	oci := &specs.Spec{
		Annotations: annotations,
		// runc 1.1 speaks spec 1.0.2; nothing here needs a newer one.
		Version:  "1.0.2",
		Hostname: spec.ID,
		Root:     &specs.Root{Path: filepath.Join(dir, "rootfs")},
		Process: &specs.Process{
			Args: []string{runtime.EnvdPathInSandbox, "--log-file", logDirInSandbox + "/envd.log"},
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/root",
				"TERM=xterm",
				// CRIU cannot checkpoint MPTCP sockets; envd must not open any.
				"GODEBUG=multipathtcp=0",
			},
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: slices.Clone(capabilities), Effective: slices.Clone(capabilities), Permitted: slices.Clone(capabilities),
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: s.nofile, Soft: s.nofile}},
			// sudo inside the sandbox needs setuid to work.
			NoNewPrivileges: false,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=256m"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: runtime.EnvdPathInSandbox, Type: "bind", Source: s.envdSource(dir, view), Options: bindRO},
			{Destination: logDirInSandbox, Type: "bind", Source: filepath.Join(view, "log"), Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
			{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(view, "hosts"), Options: bindRO},
			{Destination: "/etc/hostname", Type: "bind", Source: filepath.Join(view, "hostname"), Options: bindRO},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(view, "resolv.conf"), Options: bindRO},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace}, netns,
			},
			Devices:     devices,
			CgroupsPath: s.CgroupPath(spec.ID),
			Resources:   res,
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	if o.UserNS {
		s.userns(oci, o.OwnNet, base)
	}
	return oci
}

// annotationTier records the sandbox's isolation tier in its bundle.
const annotationTier = "io.agentbox.tier"

// HardenedSpec is OCISpec with the shared hardening and the driver's own
// (o.Harden): the config.json a sandbox boots with.
func (s *Store) HardenedSpec(spec runtime.Spec, dir string, o Options, base uint32) *specs.Spec {
	oci := s.OCISpec(spec, dir, o, base)
	if oci.Annotations == nil {
		oci.Annotations = map[string]string{}
	}
	oci.Annotations[annotationTier] = o.Tier
	if o.Harden != nil {
		o.Harden(oci)
	}
	harden(oci, spec)
	addVolumeMounts(oci, dir, spec.Volumes)
	return oci
}

// harden adds to the base spec what depends on the limits, on every tier:
// a size-limited /tmp, CPU shares proportional to the CPU count, more
// masked paths, and an OOM score that makes the host's OOM killer pick
// sandbox processes before the server.
func harden(oci *specs.Spec, spec runtime.Spec) {
	if mb := spec.Resources.TmpMB; mb > 0 {
		oci.Mounts = append(oci.Mounts, specs.Mount{
			Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%dm", mb)},
		})
	}
	if n := spec.Resources.CPUCount; n > 0 && oci.Linux.Resources != nil && oci.Linux.Resources.CPU != nil {
		oci.Linux.Resources.CPU.Shares = ptr(uint64(1024 * n))
	}
	oci.Linux.MaskedPaths = append(oci.Linux.MaskedPaths, "/proc/kallsyms", "/sys/devices/virtual/powercap", "/sys/kernel")
	oci.Process.OOMScoreAdj = ptr(500)
}
