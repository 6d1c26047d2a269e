package localrun

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Plan is the filesystem policy of one run, in Landlock's terms. Landlock
// only allows, so "read everything except D" is built from the siblings
// along the path to each denied path: every entry of / is readable except
// the one leading to D, in which every entry is readable except the next
// one, and so on down to D, which gets no rule. The directories on the way
// (Listable) may be listed, not read from; names of new files created in
// them after the start are not readable either.
//
// A denied path inside a writable directory cannot be carved out that way:
// files the command creates there later would be unreadable. Those are
// masked instead (Masks): agentbox mounts an unreadable empty file or
// directory over them in the command's private mount namespace.
type Plan struct {
	Read     []string // readable and executable, with everything beneath
	Listable []string // directories along a denied path: list only
	Write    []string // writable (and readable), with everything beneath
	Masks    []string // denied paths inside a writable directory
	ReadOnly []string // paths inside a writable directory kept read-only (DefaultReadOnly)
	Denied   []Denial // every denied path that exists, for explanations
	Home     string   // for WriteHint
}

// Denial is one path the command may not read, and why.
type Denial struct {
	Path string
	Rule string // the config entry that denies it ("~/.ssh", "deny_read ./secrets")
}

// DefaultReadOnly are the paths of the project whose contents run outside
// the sandbox later (git runs hooks, and config can name an fsmonitor or
// a hooks path, when the user next runs git): a command could plant code
// there, so they stay readable and are mounted read-only.
func DefaultReadOnly() []string {
	return []string{"./.git/hooks", "./.git/config"}
}

// Env is where a run starts.
type Env struct {
	Home, Dir string // home and working directories, absolute
	TmpDir    string // the writable temporary directory (default /tmp)
	// RuntimeDir is $XDG_RUNTIME_DIR (default /run/user/<uid>) and
	// AuthSock $SSH_AUTH_SOCK, for DefaultMasked.
	RuntimeDir, AuthSock string
}

// DefaultMasked are the agent and service sockets masked by default, with
// the directories holding them. Landlock (before ABI 9) does not restrict
// connecting to a unix socket by path, and these would let a command use
// the user's SSH keys, run commands outside the sandbox (systemd --user,
// D-Bus, Docker, Podman) or sign with GnuPG; so they are hidden by a mount
// in the command's namespace, whatever the read rules say.
func DefaultMasked(env Env) []string {
	rt := env.RuntimeDir
	if rt == "" {
		rt = fmt.Sprintf("/run/user/%d", os.Getuid())
	}
	out := []string{
		rt + "/bus", rt + "/systemd", rt + "/gnupg", rt + "/docker.sock", rt + "/podman",
		rt + "/keyring", rt + "/gcr", rt + "/ssh-agent.socket", rt + "/openssh_agent",
		"/run/docker.sock", "/var/run/docker.sock", "/run/containerd/containerd.sock",
		"/run/podman/podman.sock", "/run/dbus/system_bus_socket", "~/.gnupg",
	}
	if env.AuthSock != "" {
		out = append(out, env.AuthSock)
	}
	return out
}

// devices are writable by every command: the terminal and the null devices.
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/shm"}

// BuildPlan turns a config into a plan for env. Paths that do not exist
// are left out: there is nothing to deny or allow yet.
func BuildPlan(c Config, env Env) (Plan, error) {
	p := Plan{Home: env.Home}
	if env.Dir == "/" || env.Dir == env.Home {
		return p, fmt.Errorf("the working directory %s would be writable, shell startup files and all; run agentbox run in a project directory", env.Dir)
	}
	tmp := env.TmpDir
	if tmp == "" {
		tmp = "/tmp"
	}
	writes := []string{env.Dir, tmp}
	for _, w := range c.Write {
		writes = append(writes, expand(w, env.Home, env.Dir))
	}
	for _, w := range append(writes, devices...) {
		if real, ok := existing(w); ok {
			p.Write = append(p.Write, real)
		}
	}
	reads := map[string]bool{}
	for _, r := range c.Read {
		if real, ok := existing(expand(r, env.Home, env.Dir)); ok {
			reads[real] = true
		}
	}
	patterns := c.DenyRead
	if !c.NoDefaultDeny {
		patterns = append(DefaultDenyRead(), patterns...)
	}
	var deny []string
	for _, pat := range patterns {
		matches, err := filepath.Glob(expand(pat, env.Home, env.Dir))
		if err != nil {
			return p, fmt.Errorf("deny_read %q: %w", pat, err)
		}
		for _, m := range matches {
			real, ok := existing(m)
			if !ok || reads[real] || coveredBy(real, reads) {
				continue // re-allowed with --read
			}
			if real == "/" {
				return p, fmt.Errorf("deny_read %q: cannot deny the whole filesystem", pat)
			}
			p.Denied = append(p.Denied, Denial{Path: real, Rule: pat})
			deny = append(deny, real)
		}
	}
	masked := map[string]bool{}
	if !c.NoDefaultDeny {
		for _, m := range DefaultMasked(env) {
			real, ok := existing(expand(m, env.Home, env.Dir))
			if !ok || reads[real] || coveredBy(real, reads) || real == "/" {
				continue
			}
			masked[real] = true
			if !slices.Contains(deny, real) {
				p.Denied = append(p.Denied, Denial{Path: real, Rule: m})
				deny = append(deny, real)
			}
		}
	}
	var outside []string
	for _, d := range deny {
		if masked[d] || underAny(d, p.Write) {
			p.Masks = append(p.Masks, d)
		} else {
			outside = append(outside, d)
		}
	}
	read, list, err := carve("/", outside)
	if err != nil {
		return p, err
	}
	p.Read, p.Listable = read, list
	sort.Strings(p.Masks)
	for _, r := range DefaultReadOnly() {
		if real, ok := existing(expand(r, env.Home, env.Dir)); ok && underAny(real, p.Write) && !slices.Contains(p.Masks, real) {
			p.ReadOnly = append(p.ReadOnly, real)
		}
	}
	return p, nil
}

// carve lists what stays readable under root when the paths deny are
// not: the entries of each directory on the way to a denied path, but
// not that path nor the directories leading to it (returned as list).
func carve(root string, deny []string) (read, list []string, err error) {
	if len(deny) == 0 {
		return []string{root}, nil, nil
	}
	list = append(list, root)
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, nil, fmt.Errorf("listing %s to build the read rules: %w", root, err)
	}
	for _, e := range entries {
		child := filepath.Join(root, e.Name())
		var below []string
		denied := false
		for _, d := range deny {
			switch {
			case d == child:
				denied = true
			case under(d, child):
				below = append(below, d)
			}
		}
		switch {
		case denied:
		case len(below) > 0:
			r, l, err := carve(child, below)
			if err != nil {
				return nil, nil, err
			}
			read, list = append(read, r...), append(list, l...)
		default:
			read = append(read, child)
		}
	}
	return read, list, nil
}

// existing resolves p's symlinks; false when p does not exist.
func existing(p string) (string, bool) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", false
	}
	return real, true
}

// under reports whether p is strictly inside dir.
func under(p, dir string) bool {
	if dir == "/" {
		return p != "/"
	}
	return strings.HasPrefix(p, dir+"/")
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || under(p, d) {
			return true
		}
	}
	return false
}

func coveredBy(p string, dirs map[string]bool) bool {
	for d := range dirs {
		if under(p, d) {
			return true
		}
	}
	return false
}

// WriteHint is the path to suggest for --write when a write of path is
// refused: its directory, but under the home directory at most two levels
// down (~/.cache/go-build, not one of its 256 subdirectories). --write
// takes existing paths only, so a directory being created is not named.
func (p Plan) WriteHint(path string) string {
	hint := filepath.Dir(path)
	switch {
	case p.Home == "" || !under(path, p.Home):
	case hint == p.Home:
		hint = path // a file of the home directory itself, e.g. ~/.bashrc
	default:
		rel := strings.Split(strings.TrimPrefix(hint, p.Home+"/"), "/")
		hint = filepath.Join(append([]string{p.Home}, rel[:min(len(rel), 2)]...)...)
	}
	for hint != "/" {
		if _, err := os.Lstat(hint); err == nil {
			break
		}
		hint = filepath.Dir(hint)
	}
	return hint
}

// Refusal explains why a read or write of path would be refused, with the
// way to allow it, or "" when the plan allows it.
func (p Plan) Refusal(path string, write bool) string {
	for _, d := range p.Denied {
		if path == d.Path || under(path, d.Path) {
			op := "read of"
			if write {
				op = "access to"
			}
			where := "it is under " + d.Path + ", denied"
			if path == d.Path {
				where = "denied"
			}
			return fmt.Sprintf("%s %s denied: %s by the rule %q (credential stores are not readable by default); allow it with --read %s",
				op, path, where, d.Rule, d.Path)
		}
	}
	if write && underAny(path, p.ReadOnly) {
		return fmt.Sprintf("write to %s denied: it is kept read-only because git runs what it names outside the sandbox (hooks, fsmonitor); change it outside agentbox run", path)
	}
	if write && !underAny(path, p.Write) {
		return fmt.Sprintf("write to %s denied: not under a --write path (the working directory and the temporary directory are); allow it with --write %s",
			path, p.WriteHint(path))
	}
	return ""
}
