package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/ocicli"
)

// A sandbox in a user namespace gets a network namespace made together with
// that user namespace (so owned by it): runc creates both, the network
// package wires the new netns up (Plug) between `runc create` and the
// init's start (startInit), so envd's first packet already has its address. runc's checkpoints
// leave the netns out and restore into an empty one, so a restore runs
// `agentbox __hook plug-wait` as a prestart hook, which has the server Plug
// the new netns before CRIU brings sockets back (plugwait.go); Plug runs
// once more after the restore.

// ownsNetNS reports whether sandboxes' netns is made by runc inside their
// user namespace rather than joined from the network package.
func (d *Driver) ownsNetNS() bool {
	return d.b.UserNS()
}

// start runs sandbox id's init from its bundle in dir and returns its host
// pid. ownNet: runc makes its netns (see ownsNetNS), which is plugged
// before init runs; its boot id is mounted then too, and its user
// namespace's inotify caps set, in one hook exec (bootid.go).
func (d *Driver) start(ctx context.Context, id, dir string, ownNet bool) (int, error) {
	logFile := filepath.Join(dir, Name+".log")
	if !ownNet {
		if err := d.cfg.Net.Plug(ctx, id, 0); err != nil {
			return 0, err
		}
	}
	ph := bundle.NewPhases()
	pidFile := bundle.PidFile(dir)
	_ = os.Remove(pidFile)
	err := d.inSession(func() error {
		return ocicli.NullIO(func(io gorunc.IO) error {
			return d.client(logFile).Create(ctx, d.CID(id), dir, &gorunc.CreateOpts{IO: io, PidFile: pidFile})
		})
	})
	if err != nil {
		return 0, d.Failed("create", logFile, err)
	}
	pid, err := bundle.ReadPid(pidFile)
	if err != nil {
		return 0, err
	}
	bundle.RecordSession(dir, pid)
	d.noteInit(pid)
	ph.Mark("runc create")
	if ownNet {
		if err := d.cfg.Net.Plug(ctx, id, pid); err != nil {
			return 0, err
		}
	}
	ph.Mark("net plug")
	if err := d.mountBootID(ctx, dir, pid, d.b.UserNS()); err != nil {
		return 0, err
	}
	ph.Mark("boot-id hook")
	d.reserveForEnvd(id)
	err = d.startInit(ctx, id, pid)
	if errors.Is(err, errNoExecFifo) {
		err = d.client(logFile).Start(ctx, d.CID(id))
	}
	if err != nil {
		return pid, d.Failed("start", logFile, err)
	}
	ph.Mark("start init")
	d.log.Debug("container started", append([]any{"id", id}, ph.Attrs()...)...)
	return pid, nil
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

// setCRIUConf writes CRIU options for the next CRIU run on the bundle in
// dir and points its config.json at them: runc 1.1 has no flags for them
// and hands CRIU the file named by the org.criu.config annotation. runc
// reads the annotation when the container is created or restored (it
// keeps it for the container's dumps), so it is set before both.
func setCRIUConf(dir string, lines []string) error {
	if err := writeCRIUConf(dir, lines); err != nil {
		return err
	}
	return bundle.UpdateConfig(dir, func(s *specs.Spec) { setCRIUAnnotation(s, dir) })
}

// setCRIUAnnotation points s, the spec of the bundle in dir, at the
// bundle's CRIU configuration file.
func setCRIUAnnotation(s *specs.Spec, dir string) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations["org.criu.config"] = filepath.Join(dir, criuConf)
}

// writeCRIUConf replaces the options the bundle's CRIU configuration file
// holds (private to root: it is the server's, not the sandbox's).
func writeCRIUConf(dir string, lines []string) error {
	b := []byte(strings.Join(lines, "\n") + "\n")
	if err := os.WriteFile(filepath.Join(dir, criuConf), b, 0o600); err != nil {
		return fmt.Errorf("CRIU configuration: %w", err)
	}
	return nil
}

// plugHookName marks the hook setPlugHook adds, in its environment.
const plugHookName = "AGENTBOX_HOOK=plug"

// setPlugHook makes argv the bundle's network hook (replacing an earlier
// one): runc runs prestart hooks when CRIU has made the namespaces of a
// restore, and when a container is created.
func setPlugHook(dir string, argv []string) error {
	return bundle.UpdateConfig(dir, func(s *specs.Spec) {
		if s.Hooks == nil {
			s.Hooks = &specs.Hooks{}
		}
		// runc 1.1 runs only prestart hooks on a restore.
		hooks := slices.DeleteFunc(s.Hooks.Prestart, func(h specs.Hook) bool { return slices.Contains(h.Env, plugHookName) }) //nolint:staticcheck
		timeout := 30
		s.Hooks.Prestart = append(hooks, specs.Hook{ //nolint:staticcheck
			Path:    argv[0],
			Args:    argv,
			Env:     []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", plugHookName},
			Timeout: &timeout,
		})
	})
}

// clearPlugHook removes the network hook setPlugHook added for a restore: a
// fresh boot plugs the netns itself between create and start, and the
// hook would fail on a veth that no longer waits for it.
func clearPlugHook(dir string) error {
	return bundle.UpdateConfig(dir, func(s *specs.Spec) {
		if s.Hooks != nil {
			s.Hooks.Prestart = slices.DeleteFunc(s.Hooks.Prestart, func(h specs.Hook) bool { return slices.Contains(h.Env, plugHookName) }) //nolint:staticcheck
		}
	})
}
