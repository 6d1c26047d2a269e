package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/patternmatcher"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Step operations of a BuildSpec.
const (
	OpRun        = "RUN"
	OpCopy       = "COPY"
	OpEnv        = "ENV"
	OpWorkdir    = "WORKDIR"
	OpUser       = "USER"
	OpExpose     = "EXPOSE"
	OpCmd        = "CMD"
	OpEntrypoint = "ENTRYPOINT"
	OpReady      = "READY" // ready check (HEALTHCHECK CMD in a Dockerfile)
)

// Step is one instruction of a build. Dockerfiles and the E2B build API are
// both translated into steps.
type Step struct {
	Line int    // source line, for error messages (0 if none)
	Op   string // one of the Op constants
	// Args: RUN/CMD/ENTRYPOINT the command (one shell string unless Exec);
	// ENV key, value pairs; WORKDIR/USER one value; EXPOSE ports; READY
	// one shell string.
	Args []string
	Exec bool   // exec form (JSON array) rather than a shell string
	User string // RUN: run as this user; COPY: owner (user[:group])
	// COPY: sources (relative to the context, globs allowed), destination,
	// optional octal mode, and the context: a directory, or an uploaded
	// archive (FilesHash) holding the sources.
	Src        []string
	Dest       string
	Mode       string
	ContextDir string
	Ignore     *patternmatcher.PatternMatcher
	FilesHash  string
	Force      bool // rebuild this step even when cached
}

// BuildSpec is a build request: a base plus steps.
type BuildSpec struct {
	// TeamID owns the template: FROM resolves in its view, the name is its
	// own, and its steps' cache is its own. "" is the operator (builtins).
	TeamID string
	Name   string   // alias, e.g. "my-app"
	Tag    string   // e.g. "v1"; "" means "default"
	Tags   []string // extra tags
	// ID fixes the template ID (the E2B API hands it out before the build);
	// default: NamedID(TeamID, Name, Tag), so a rebuild replaces the
	// team's template and no other team can name the same ID.
	ID string
	// From is "scratch", a template the team may use (ID, alias,
	// alias:tag) or an image reference. FromImage skips the template
	// lookup. Images on this host's disk ("oci:<dir>",
	// "docker-archive:<file>") need LocalImages.
	From        string
	FromImage   bool
	LocalImages bool // operator builds only: From may read host paths
	Auth        *RegistryAuth
	Steps       []Step
	// StartCmd/ReadyCmd override what the steps and the base set.
	StartCmd, ReadyCmd         *string
	CPUCount, MemoryMB, DiskMB int
	Force                      bool   // ignore the step cache
	Source                     string // description kept with the template
	// StepUser is the user RUN and COPY steps start as on a template base
	// ("root" for Dockerfiles); "" keeps the base's default user. The
	// template's default user stays the base's unless a USER step sets it.
	StepUser string
	// Runner runs the RUN steps, each as a short-lived sandbox of TeamID
	// (the sandbox manager); a spec with RUN steps and no runner is refused.
	Runner StepRunner
	// BuildMemoryMB and BuildDiskMB size RUN step sandboxes (0 = the
	// team's defaults).
	BuildMemoryMB, BuildDiskMB int
	// Definition is kept with the template (builtins built as layers).
	Definition *Definition
	// BuildID names the build (step sandboxes, logs) and is kept with the
	// template (see Template.BuildID).
	BuildID string
}

// buildState is the image as built so far.
type buildState struct {
	LayerIDs   []string
	Env        []string // KEY=VALUE, in order
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
	StartCmd   string // from a template base or the E2B API
	ReadyCmd   string
	Exposed    []int
	base       *Template
	userSet    bool // a USER step ran
}

func (b *buildState) getenv(k string) (string, bool) {
	for _, kv := range slices.Backward(b.Env) {
		if key, v, _ := strings.Cut(kv, "="); key == k {
			return v, true
		}
	}
	return "", false
}

func (b *buildState) setenv(k, v string) {
	b.Env = slices.DeleteFunc(b.Env, func(kv string) bool { key, _, _ := strings.Cut(kv, "="); return key == k })
	b.Env = append(b.Env, k+"="+v)
}

// BuildError is a failed build step: the step's line, its output and exit
// code. It wraps errdefs.ErrInvalidArgument.
type BuildError struct {
	Step     int // 1-based step index
	Line     int
	Op       string
	ExitCode int    // RUN only; -1 if it did not exit
	Output   string // last lines of its output
	Err      error
}

func (e *BuildError) Error() string {
	where := fmt.Sprintf("step %d", e.Step)
	if e.Line > 0 {
		where += fmt.Sprintf(" (line %d)", e.Line)
	}
	msg := fmt.Sprintf("%s %s: %v", where, e.Op, e.Err)
	if le, ok := errors.AsType[*LimitError](e.Err); ok {
		msg = fmt.Sprintf("%s %s: %s", where, e.Op, le.Msg)
	} else if e.Op == OpRun && e.ExitCode >= 0 {
		msg = fmt.Sprintf("%s %s failed with exit code %d", where, e.Op, e.ExitCode)
	}
	if e.Output != "" {
		msg += ": " + e.Output
	}
	return msg
}

func (e *BuildError) Unwrap() []error { return []error{e.Err, errdefs.ErrInvalidArgument} }

// NamedID is the template ID team's build of name:tag gets: stable per
// team, name and tag, so rebuilding replaces the team's template while its
// layers stay cached, and another team building the same name gets another
// ID (it cannot overwrite this one).
func NamedID(team, name, tag string) string {
	if tag == "" {
		tag = "default"
	}
	return "t" + LayerKey("named-template", team, name, tag)[:19]
}

// CheckName refuses a template name team may not build: malformed, or a
// builtin's (reserved: a team's "base" would shadow the server's for it).
func CheckName(team, name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("template name %q: want lowercase letters, digits, '.', '_' or '-': %w", name, errdefs.ErrInvalidArgument)
	}
	if team != "" && ReservedName(name) {
		return fmt.Errorf("template name %q is reserved for the server's builtin template; choose another name: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// finalizeLayerID is the small layer every template from an image gets: the
// mount points and files the runtime binds over.
var finalizeLayerID = LayerKey("agentbox-finalize", "v1")

func (s *Store) ensureFinalizeLayer(ctx context.Context) error {
	_, err := s.CreateLayer(ctx, finalizeLayerID, "agentbox mount points", func(_ context.Context, rootfs string) error {
		for _, d := range []string{".agentbox/bin", "proc", "sys", "dev", "run", "etc", "tmp"} {
			if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
				return err
			}
		}
		if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777|os.ModeSticky); err != nil {
			return err
		}
		for _, f := range []string{"etc/resolv.conf", "etc/hosts", "etc/hostname"} {
			if err := os.WriteFile(filepath.Join(rootfs, f), nil, 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// BuildFromSpec builds spec into a template: a layer per RUN, COPY and
// WORKDIR step, each cached under the hash of the team, its parent and its
// inputs, so an unchanged rebuild only writes the template's config. RUN
// steps run as sandboxes through spec.Runner; COPY and WORKDIR write the
// step's layer here, confined to it. Builds take no store-wide lock: only
// the template they install is locked, for the rename. On failure nothing of
// the build is left but the layers of steps that succeeded (cached for the
// next try, and collected by GC otherwise).
func (s *Store) BuildFromSpec(ctx context.Context, spec BuildSpec, progress io.Writer) (*Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := CheckName(spec.TeamID, spec.Name); err != nil {
		return nil, err
	}
	if err := s.admitDisk("build a template"); err != nil {
		return nil, err
	}
	if spec.Tag == "" {
		spec.Tag = "default"
	}
	for _, t := range append([]string{spec.Tag}, spec.Tags...) {
		if !namePattern.MatchString(strings.ToLower(t)) {
			return nil, fmt.Errorf("tag %q: want letters, digits, '.', '_' or '-': %w", t, errdefs.ErrInvalidArgument)
		}
	}
	id := spec.ID
	if id == "" {
		id = NamedID(spec.TeamID, spec.Name, spec.Tag)
	}
	if !validID(id) || validLayerID(id) {
		return nil, fmt.Errorf("template id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	if old, err := s.load(id); err == nil && old.TeamID != spec.TeamID {
		return nil, fmt.Errorf("template %s: %w", id, errdefs.ErrNotFound)
	}
	if spec.BuildID == "" {
		spec.BuildID = "b" + randomSuffix() + randomSuffix()
	}
	start := time.Now()
	work, err := s.newBuildWork(ctx, spec.BuildID)
	if err != nil {
		return nil, err
	}
	defer work.close(ctx)

	st, err := s.resolveBase(ctx, spec, progress)
	if err != nil {
		return nil, err
	}
	if err := work.hold(ctx, true, st.LayerIDs...); err != nil {
		return nil, err
	}
	// The team opens the chain: a step's layer is found again only by the
	// team that built it, so no team can obtain another's RUN output (made
	// with its network policy and credentials) by repeating its inputs.
	key := LayerKey(append([]string{"base", "team:" + spec.TeamID}, st.LayerIDs...)...)
	contexts := map[string]string{} // files hash -> extracted upload
	for i, step := range spec.Steps {
		n := i + 1
		fmt.Fprintf(progress, "==> [%d/%d] %s\n", n, len(spec.Steps), describeStep(step))
		stepStart := time.Now()
		fail := func(err error) (*Template, error) {
			var be *BuildError
			if errors.As(err, &be) {
				be.Step, be.Line, be.Op = n, step.Line, step.Op
				return nil, be
			}
			return nil, &BuildError{Step: n, Line: step.Line, Op: step.Op, ExitCode: -1, Err: err}
		}
		if step.Op == OpCopy && step.FilesHash != "" {
			dir, ok := contexts[step.FilesHash]
			if !ok {
				dir = filepath.Join(work.dir, "context-"+step.FilesHash)
				if err := s.extractUpload(ctx, spec.TeamID, step.FilesHash, dir); err != nil {
					return fail(err)
				}
				contexts[step.FilesHash] = dir
			}
			step.ContextDir = dir
		}
		desc, err := s.stepKey(step, st)
		if err != nil {
			return fail(err)
		}
		key = LayerKey(key, desc)
		if spec.Force || step.Force {
			key = LayerKey(key, "force", randomSuffix()+randomSuffix())
		}
		switch step.Op {
		case OpEnv:
			for j := 0; j+1 < len(step.Args); j += 2 {
				st.setenv(step.Args[j], step.Args[j+1])
			}
			continue
		case OpUser:
			st.User, st.userSet = step.Args[0], true
			continue
		case OpExpose:
			for _, p := range step.Args {
				var port int
				if _, err := fmt.Sscanf(strings.TrimSuffix(strings.TrimSuffix(p, "/tcp"), "/udp"), "%d", &port); err != nil || port < 1 || port > 65535 {
					return fail(fmt.Errorf("EXPOSE %q: not a port", p))
				}
				st.Exposed = append(st.Exposed, port)
			}
			continue
		case OpCmd:
			st.Cmd = shellOrExec(step)
			continue
		case OpEntrypoint:
			st.Entrypoint = shellOrExec(step)
			st.Cmd = nil // as in Docker: ENTRYPOINT resets an inherited CMD
			continue
		case OpReady:
			st.ReadyCmd = step.Args[0]
			continue
		case OpWorkdir:
			wd := step.Args[0]
			if !path.IsAbs(wd) {
				wd = path.Join("/", st.Workdir, wd)
			}
			st.Workdir = path.Clean(wd)
		case OpRun:
			if spec.Runner == nil {
				return fail(fmt.Errorf("RUN steps run as sandboxes and this build has no step runner (build through the server: `agentbox template build -f` or the E2B build API): %w", errdefs.ErrUnavailable))
			}
		case OpCopy:
		default:
			return fail(fmt.Errorf("unsupported instruction %s", step.Op))
		}
		// Layer steps. Held before the commit is looked up, so GC keeps it.
		if err := work.hold(ctx, false, key); err != nil {
			return fail(err)
		}
		cached, err := s.CreateLayer(ctx, key, fmt.Sprintf("%s: %s", spec.Name, describeStep(step)), func(ctx context.Context, upper string) error {
			if step.Op == OpRun {
				return s.runStep(ctx, spec, step, st, upper, progress)
			}
			return s.writeStep(step, st, upper, progress)
		})
		if err != nil {
			return fail(err)
		}
		if empty, _ := dirEmpty(s.LayerPath(key)); !empty {
			st.LayerIDs = append(st.LayerIDs, key)
		}
		if cached {
			fmt.Fprintf(progress, "    cached\n")
		} else {
			fmt.Fprintf(progress, "    done in %.1fs\n", time.Since(stepStart).Seconds())
		}
	}
	t, err := s.templateFromState(spec, id, st)
	if err != nil {
		return nil, err
	}
	t.BuildSeconds = time.Since(start).Seconds()
	if err := s.install(ctx, t); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "built %s:%s (%s) in %.1fs: %d layers, %.1f MB\n", spec.Name, spec.Tag, id, t.BuildSeconds, len(t.LayerIDs), float64(t.SizeBytes)/1e6)
	s.log.InfoContext(ctx, "template built", "name", spec.Name, "tag", spec.Tag, "id", id, "team", spec.TeamID, "seconds", t.BuildSeconds, "layers", len(t.LayerIDs))
	return s.load(id)
}

// resolveBase turns spec.From into the starting state.
func (s *Store) resolveBase(ctx context.Context, spec BuildSpec, progress io.Writer) (*buildState, error) {
	from := strings.TrimSpace(spec.From)
	switch {
	case from == "" || from == "scratch":
		fmt.Fprintf(progress, "==> base: scratch\n")
		if err := s.ensureFinalizeLayer(ctx); err != nil {
			return nil, err
		}
		return &buildState{LayerIDs: []string{finalizeLayerID}}, nil
	case !spec.FromImage:
		t, err := s.Get(ctx, spec.TeamID, from)
		if err == nil {
			fmt.Fprintf(progress, "==> base: template %s (%s)\n", from, t.ID)
			st := &buildState{
				LayerIDs: slices.Clone(t.LayerIDs), Workdir: t.DefaultWorkdir, User: t.DefaultUser,
				StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, Exposed: slices.Clone(t.ExposedPorts), base: t,
			}
			if len(st.LayerIDs) == 0 {
				st.LayerIDs = []string{t.ID} // its own rootfs dir
			}
			if spec.StepUser != "" {
				st.User = spec.StepUser
			}
			for _, k := range slices.Sorted(maps.Keys(t.Env)) {
				st.Env = append(st.Env, k+"="+t.Env[k])
			}
			return st, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	if !spec.LocalImages && (strings.HasPrefix(from, "oci:") || strings.HasPrefix(from, "docker-archive:")) {
		return nil, fmt.Errorf("FROM %s: images on the server's disk (oci:, docker-archive:) are for operator builds only; name a template or a registry image: %w", from, errdefs.ErrInvalidArgument)
	}
	fmt.Fprintf(progress, "==> base: image %s\n", from)
	st, err := s.importImage(ctx, from, spec.Auth, progress)
	if err != nil {
		if !spec.FromImage && !strings.Contains(from, "/") && !strings.Contains(from, ":") {
			return nil, fmt.Errorf("FROM %s: no template of that name, and as an image: %w", from, err)
		}
		return nil, fmt.Errorf("FROM %s: %w", from, err)
	}
	if err := s.ensureFinalizeLayer(ctx); err != nil {
		return nil, err
	}
	st.LayerIDs = append(st.LayerIDs, finalizeLayerID)
	return st, nil
}

// stepKey describes everything a layer step's result depends on besides
// its parent: the instruction, the env/user/workdir it runs with, and the
// content it copies.
func (s *Store) stepKey(step Step, st *buildState) (string, error) {
	d := struct {
		Op      string
		Args    []string
		Exec    bool
		User    string
		Src     []string
		Dest    string
		Mode    string
		Files   string
		Env     []string
		Workdir string
		CurUser string
	}{step.Op, step.Args, step.Exec, step.User, step.Src, step.Dest, step.Mode, step.FilesHash, st.Env, st.Workdir, st.User}
	if step.Op == OpCopy && step.FilesHash == "" {
		h, err := hashSources(step)
		if err != nil {
			return "", err
		}
		d.Files = h
	}
	b, err := json.Marshal(d)
	return string(b), err
}

func (s *Store) templateFromState(spec BuildSpec, id string, st *buildState) (*Template, error) {
	t := &Template{
		ID: id, TeamID: spec.TeamID, Aliases: []string{spec.Name}, LayerIDs: st.LayerIDs,
		CPUCount: DefaultCPUCount, MemoryMB: DefaultMemoryMB, DiskMB: DefaultDiskMB,
		DefaultUser: st.User, DefaultWorkdir: st.Workdir, StartCmd: st.StartCmd, ReadyCmd: st.ReadyCmd,
		ExposedPorts: slices.Compact(slices.Sorted(slices.Values(st.Exposed))),
		Source:       spec.Source, CreatedAt: time.Now().UTC(), Definition: spec.Definition,
		BuildID: spec.BuildID,
	}
	t.Tags = slices.Compact(slices.Sorted(slices.Values(append([]string{spec.Tag}, spec.Tags...))))
	if b := st.base; b != nil {
		t.CPUCount, t.MemoryMB, t.DiskMB, t.Isolation = b.CPUCount, b.MemoryMB, b.DiskMB, b.Isolation
		if !st.userSet {
			t.DefaultUser = b.DefaultUser
		}
	}
	if spec.CPUCount > 0 {
		t.CPUCount = spec.CPUCount
	}
	if spec.MemoryMB > 0 {
		t.MemoryMB = spec.MemoryMB
	}
	if spec.DiskMB > 0 {
		t.DiskMB = spec.DiskMB
	}
	if t.DefaultUser == "" {
		t.DefaultUser = "root"
	}
	if t.DefaultWorkdir == "" {
		t.DefaultWorkdir = "/"
		if t.DefaultUser != "root" {
			t.DefaultWorkdir = "/home/" + t.DefaultUser
		}
	}
	if len(st.Entrypoint)+len(st.Cmd) > 0 {
		t.StartCmd = commandString(append(slices.Clone(st.Entrypoint), st.Cmd...))
	}
	if spec.StartCmd != nil {
		t.StartCmd = *spec.StartCmd
	}
	if spec.ReadyCmd != nil {
		t.ReadyCmd = *spec.ReadyCmd
	}
	if len(st.Env) > 0 {
		t.Env = map[string]string{}
		for _, kv := range st.Env {
			k, v, _ := strings.Cut(kv, "=")
			if k != "PATH" || v != defaultPath {
				t.Env[k] = v
			}
		}
	}
	for _, ref := range t.LayerIDs {
		if validLayerID(ref) {
			b, err := os.ReadFile(filepath.Join(s.layersRoot(), ref, layerMetaFile))
			if err != nil {
				return nil, fmt.Errorf("layer %s: %w", ref[:12], err)
			}
			var l Layer
			_ = json.Unmarshal(b, &l)
			t.SizeBytes += l.SizeBytes
		} else if b, err := s.load(ref); err == nil {
			t.SizeBytes += b.SizeBytes
		}
	}
	return t, nil
}

// install writes t's config, replacing a template with the same ID of the
// same owner (never another's). Layers live outside the template dir, so
// sandboxes running on the old version are not disturbed.
func (s *Store) install(ctx context.Context, t *Template) error {
	unlock := s.locks.lock("template/" + t.ID)
	defer unlock()
	if old, err := s.load(t.ID); err == nil && old.TeamID != t.TeamID {
		return fmt.Errorf("template %s: %w", t.ID, errdefs.ErrNotFound)
	}
	gcUnlock, err := s.gcLock(ctx, false) // its layers become referenced atomically
	if err != nil {
		return err
	}
	defer gcUnlock()
	work := filepath.Join(s.dir, trashPrefix+"new-"+t.ID+"-"+randomSuffix())
	if err := os.Mkdir(work, 0o700); err != nil {
		return err
	}
	if err := writeMeta(work, t); err != nil {
		os.RemoveAll(work)
		return err
	}
	final := filepath.Join(s.dir, t.ID)
	if _, err := os.Stat(final); err == nil {
		if _, err := os.Stat(filepath.Join(final, rootfsDir)); err == nil {
			os.RemoveAll(work)
			return fmt.Errorf("template %s has its own rootfs and cannot be replaced; delete it first: %w", t.ID, errdefs.ErrConflict)
		}
		trash := filepath.Join(s.dir, trashPrefix+t.ID+"-"+randomSuffix())
		if err := os.Rename(final, trash); err != nil {
			os.RemoveAll(work)
			return err
		}
		defer os.RemoveAll(trash)
	}
	return os.Rename(work, final)
}

// Register stores a template made of existing layers (tests and tools use
// it; t.TeamID names its owner).
func (s *Store) Register(ctx context.Context, t *Template) error {
	if !validID(t.ID) || validLayerID(t.ID) {
		return fmt.Errorf("template id %q: %w", t.ID, errdefs.ErrInvalidArgument)
	}
	for _, ref := range t.LayerIDs {
		if _, err := s.layerRefPath(ref); err != nil {
			return fmt.Errorf("template %s: %w (%w)", t.ID, err, errdefs.ErrInvalidArgument)
		}
		if validLayerID(ref) && !s.HasLayer(ref) {
			return fmt.Errorf("template %s: layer %s: %w", t.ID, ref, errdefs.ErrNotFound)
		}
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now().UTC()
	}
	return s.install(ctx, t)
}

func describeStep(st Step) string {
	switch st.Op {
	case OpCopy:
		return fmt.Sprintf("COPY %s %s", strings.Join(st.Src, " "), st.Dest)
	case OpRun:
		s := "RUN " + strings.Join(st.Args, " ")
		if st.User != "" {
			s += " (as " + st.User + ")"
		}
		return s
	}
	return st.Op + " " + strings.Join(st.Args, " ")
}

func shellOrExec(step Step) []string {
	if step.Exec {
		return slices.Clone(step.Args)
	}
	return []string{"/bin/sh", "-c", strings.Join(step.Args, " ")}
}

// commandString turns an exec-form command into one shell command line.
func commandString(args []string) string {
	if len(args) == 3 && (args[0] == "/bin/sh" || args[0] == "sh") && args[1] == "-c" {
		return args[2]
	}
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}
