package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Defaults a Definition gets for every zero field.
const (
	DefaultSuite    = "bookworm"
	DefaultCPUCount = 2
	DefaultMemoryMB = 1024
	DefaultDiskMB   = 10240
	DefaultUser     = "user"
	DefaultWorkdir  = "/home/user"
)

// Definition is everything a template build depends on. Its canonical JSON
// hashes to the template ID, so building the same definition twice finds the
// first build again.
type Definition struct {
	// Name is the alias sandboxes use to ask for the template, e.g. "base".
	Name string `json:"name"`
	// Suite is the Debian release to bootstrap; default "bookworm".
	Suite string `json:"suite"`
	// Base, if set, is the definition this one is a layer on: Packages and
	// Run are applied on top of Base's rootfs instead of bootstrapping a new
	// one, so templates sharing a base share its files on disk and in the
	// page cache. It is part of the hash, so a changed base is a new ID.
	Base *Definition `json:"base,omitempty"`
	// Packages are installed on top of the minbase variant, or on top of
	// Base (no recommends). Order does not matter: they are sorted before
	// hashing.
	Packages []string `json:"packages"`
	// Mirror is a Debian mirror URI or sources.list line; empty means
	// mmdebstrap's default (deb.debian.org plus updates and security).
	Mirror string `json:"mirror,omitempty"`
	// CPUCount, MemoryMB and DiskMB are the sandbox defaults (2, 1024, 10240).
	CPUCount int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	DiskMB   int `json:"diskSizeMB"`
	// DefaultUser is created with uid/gid 1000 and passwordless sudo; default "user".
	DefaultUser string `json:"defaultUser"`
	// DefaultWorkdir is the cwd of processes; default "/home/user".
	DefaultWorkdir string `json:"defaultWorkdir"`
	// Env is set for every process in sandboxes of this template.
	Env map[string]string `json:"env,omitempty"`
	// Run are shell commands run as root inside the rootfs (chroot) after
	// the packages are installed, in order, e.g. to warm caches.
	Run []string `json:"run,omitempty"`
	// StartCmd becomes the template's start command (see Template.StartCmd).
	StartCmd string `json:"startCmd,omitempty"`
	// ReadyCmd becomes the template's ready check (see Template.ReadyCmd).
	ReadyCmd string `json:"readyCmd,omitempty"`
}

var (
	namePattern    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	packagePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?$`)
	userPattern    = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// Normalize returns a copy with defaults applied and packages sorted and
// deduplicated, or an error wrapping errdefs.ErrInvalidArgument.
func (d Definition) Normalize() (Definition, error) {
	if !namePattern.MatchString(d.Name) {
		return d, fmt.Errorf("template name %q: want lowercase letters, digits, '.', '_' or '-': %w", d.Name, errdefs.ErrInvalidArgument)
	}
	if d.Suite == "" {
		d.Suite = DefaultSuite
	}
	if d.CPUCount == 0 {
		d.CPUCount = DefaultCPUCount
	}
	if d.MemoryMB == 0 {
		d.MemoryMB = DefaultMemoryMB
	}
	if d.DiskMB == 0 {
		d.DiskMB = DefaultDiskMB
	}
	if d.DefaultUser == "" {
		d.DefaultUser = DefaultUser
	}
	if d.DefaultWorkdir == "" {
		d.DefaultWorkdir = "/home/" + d.DefaultUser
	}
	if d.CPUCount < 0 || d.MemoryMB < 0 || d.DiskMB < 0 {
		return d, fmt.Errorf("template %s: negative resource default: %w", d.Name, errdefs.ErrInvalidArgument)
	}
	if !userPattern.MatchString(d.DefaultUser) {
		return d, fmt.Errorf("template %s: user %q: %w", d.Name, d.DefaultUser, errdefs.ErrInvalidArgument)
	}
	if !strings.HasPrefix(d.DefaultWorkdir, "/") {
		return d, fmt.Errorf("template %s: workdir %q must be absolute: %w", d.Name, d.DefaultWorkdir, errdefs.ErrInvalidArgument)
	}
	if d.Base != nil {
		b, err := d.Base.Normalize()
		if err != nil {
			return d, fmt.Errorf("template %s: base: %w", d.Name, err)
		}
		if b.Suite != d.Suite {
			return d, fmt.Errorf("template %s: suite %s differs from its base's (%s): %w", d.Name, d.Suite, b.Suite, errdefs.ErrInvalidArgument)
		}
		d.Base = &b
	}
	pkgs := slices.Clone(d.Packages)
	for _, p := range pkgs {
		if !packagePattern.MatchString(p) {
			return d, fmt.Errorf("template %s: package %q: %w", d.Name, p, errdefs.ErrInvalidArgument)
		}
	}
	slices.Sort(pkgs)
	d.Packages = slices.Compact(pkgs)
	return d, nil
}

// ID is the template ID of the normalized definition: "t" and the first 19
// hex digits of the SHA-256 of its JSON (encoding/json sorts map keys, so the
// encoding is canonical).
func (d Definition) ID() (string, error) {
	n, err := d.Normalize()
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(n)
	if err != nil {
		return "", fmt.Errorf("encode definition: %w", err)
	}
	sum := sha256.Sum256(b)
	return "t" + hex.EncodeToString(sum[:])[:19], nil
}

// profileWithoutID makes Debian's /etc/profile ask bash for the user id
// (EUID) instead of running `id -u`. Every command an SDK runs is a login
// shell (`bash -l -c`), so the stock profile costs each command a fork and
// an exec more, tens of milliseconds under gVisor; PATH comes out the same,
// and shells without EUID (dash's `sh -l`) still run `id -u`.
const profileWithoutID = `sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/g' /etc/profile`

// BuiltinDefinitions are the templates agentbox knows how to build without
// any input, keyed by name.
func BuiltinDefinitions() map[string]Definition {
	base := Definition{
		Name:  "base",
		Suite: DefaultSuite,
		Packages: []string{
			"bash", "coreutils", "procps", "python3", "python-is-python3",
			"nodejs", "npm", "curl", "git", "ca-certificates", "sudo",
			"iproute2", "iputils-ping", "less", "nano",
		},
		Run: []string{profileWithoutID},
	}
	return map[string]Definition{
		"base":                base,
		"code-interpreter-v1": codeInterpreterDefinition(base),
		"browser":             browserDefinition(base),
		"desktop":             desktopDefinition(base),
	}
}
