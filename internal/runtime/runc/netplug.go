package runc

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/runtime"
)

// A sandbox in a user namespace gets a network namespace made together with
// that user namespace (so owned by it): runc creates both, the network
// package wires the new netns up (Plug) between `runc create` and `runc
// start`, so envd's first packet already has its address. runc's checkpoints
// leave the netns out and restore into an empty one, so a restore runs the
// network package's netplug hook (`agentbox __hook netplug`) as a prestart
// hook, which moves the pre-made
// veth end in as eth0 before CRIU brings sockets back; Plug then adopts the
// restored netns.

// ownsNetNS reports whether sandbox spec's netns is made by runc inside
// its user namespace rather than joined from the network package.
func (r *Runtime) ownsNetNS(spec runtime.Spec) bool {
	return r.cfg.Net != nil && r.usernsEnabled(spec.Runtime)
}

// start runs sandbox id's init from its bundle in dir and returns its host
// pid. ownNet: runc makes its netns (see ownsNetNS), which is plugged
// before init runs.
func (r *Runtime) start(ctx context.Context, id, tier, dir string, ownNet bool) (int, error) {
	logFile := filepath.Join(dir, tier+".log")
	if r.cfg.Net == nil {
		return r.run(ctx, id, tier, dir, logFile)
	}
	if !ownNet {
		if err := r.cfg.Net.Plug(ctx, id, 0); err != nil {
			return 0, err
		}
		return r.run(ctx, id, tier, dir, logFile)
	}
	_ = os.Remove(pidFile(dir))
	if _, err := r.runc(ctx, logFile, "create", "--pid-file", pidFile(dir), "--bundle", dir, id); err != nil {
		return 0, err
	}
	pid, err := readPid(pidFile(dir))
	if err != nil {
		return 0, err
	}
	recordSession(dir, pid)
	if err := r.cfg.Net.Plug(ctx, id, pid); err != nil {
		return 0, err
	}
	_, err = r.runc(ctx, logFile, "start", id)
	return pid, err
}

// shareImage makes a checkpoint image readable by the sandbox's mapped root
// (uid), which opens parts of it itself during a restore, and by the host's
// root group: CRIU's restored root task reads the first files (timens)
// before it switches to the mapped ids, as host uid 0 and gid 0 without
// any capability over host files. Nobody else may read it: it holds the
// sandbox's memory.
func shareImage(dir string, uid int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, uid, 0); err != nil {
			return err
		}
		mode := os.FileMode(0o640)
		if d.IsDir() {
			mode = 0o750
		}
		return os.Chmod(p, mode)
	})
}

// run runs the sandbox's init with its netns in place and returns its pid.
func (r *Runtime) run(ctx context.Context, id, tier, dir, logFile string) (int, error) {
	if tier == TierRunsc {
		// runsc moves the netns's address into gVisor; a resume needs it back.
		if err := saveNetConf(dir); err != nil {
			return 0, err
		}
	}
	_ = os.Remove(pidFile(dir))
	if _, err := r.oci(ctx, id, logFile, "run", "--detach", "--pid-file", pidFile(dir), "--bundle", dir, id); err != nil {
		return 0, err
	}
	pid, err := readPid(pidFile(dir))
	if err == nil && tier != TierRunsc {
		recordSession(dir, pid)
	}
	return pid, err
}

// bundleNS is what a bundle's config.json says of its namespaces.
type bundleNS struct {
	netPath string // the network namespace joined; "" when none is named
	ownNet  bool   // runc makes the netns, inside the sandbox's user namespace
	userNS  bool
}

// readBundleNS reads the namespaces of the bundle in dir.
func readBundleNS(dir string) (bundleNS, error) {
	var out bundleNS
	s, err := readSpec(dir)
	if err != nil {
		return out, err
	}
	if s.Linux == nil {
		return out, nil
	}
	for _, ns := range s.Linux.Namespaces {
		switch ns.Type {
		case specs.NetworkNamespace:
			out.netPath, out.ownNet = ns.Path, ns.Path == ""
		case specs.UserNamespace:
			out.userNS = true
		}
	}
	return out, nil
}

// readSpec reads the bundle's config.json.
func readSpec(dir string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return &s, nil
}

// bundleOwnsNetNS reports whether the sandbox's netns is its own (made by
// runc, no path).
func bundleOwnsNetNS(dir string) bool {
	ns, err := readBundleNS(dir)
	return err == nil && ns.ownNet
}

// setCRIUConf writes CRIU options for the next restore of the bundle in dir
// and points its config.json at them: runc 1.1 has no flags for them and
// hands CRIU the file named by the org.criu.config annotation.
func setCRIUConf(dir string, lines []string) error {
	conf := filepath.Join(dir, forkCRIUConf)
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	return updateConfig(dir, func(s *specs.Spec) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations["org.criu.config"] = conf
	})
}

// plugHookName marks the hook setPlugHook adds, in its environment.
const plugHookName = "AGENTBOX_HOOK=plug"

// setPlugHook makes argv the bundle's network hook (replacing an earlier
// one): runc runs prestart hooks when CRIU has made the namespaces of a
// restore, and when a container is created.
func setPlugHook(dir string, argv []string) error {
	return updateConfig(dir, func(s *specs.Spec) {
		if s.Hooks == nil {
			s.Hooks = &specs.Hooks{}
		}
		// runc 1.1 runs only prestart hooks on a restore.
		hooks := slices.DeleteFunc(s.Hooks.Prestart, func(h specs.Hook) bool { return slices.Contains(h.Env, plugHookName) }) //nolint:staticcheck
		s.Hooks.Prestart = append(hooks, specs.Hook{                                                                          //nolint:staticcheck
			Path:    argv[0],
			Args:    argv,
			Env:     []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", plugHookName},
			Timeout: ptr(30),
		})
	})
}

// updateConfig rewrites the bundle's config.json with fn applied.
func updateConfig(dir string, fn func(*specs.Spec)) error {
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	fn(&s)
	out, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
