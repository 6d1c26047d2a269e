package template

import (
	"context"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// StepRunner runs the RUN steps of a template build as a sandbox: the same
// pipeline, runtime, hardening (user namespace, seccomp, capabilities),
// network policy and team quota as any sandbox of the team that asked for the
// build. The sandbox manager implements it; the builder never starts a
// container itself.
//
// A command that exits non-zero ends the batch with an error that should
// carry an `ExitCode() int` method (as *exec.ExitError does): the build's
// error then names the exit code beside the output's last lines.
type StepRunner interface {
	RunSteps(ctx context.Context, req StepRequest) error
}

// BuildAdmitter is implemented by a StepRunner that counts whole builds
// against their team's quota (the sandbox manager: maxBuilds, and one of
// maxSandboxes while the build runs). Builds.Start admits a build before it
// answers, so a team at its limit is refused then, and releases the slot
// when the build ends, however it ends.
type BuildAdmitter interface {
	AdmitBuild(ctx context.Context, a BuildAdmission) (release func(), err error)
}

// BuildAdmission is one build asking for a slot.
type BuildAdmission struct {
	TeamID, BuildID string
	// The sizes the build asks for (its template's; 0 = defaults): checked
	// against the team's quota before the build starts.
	CPUCount, MemoryMB int
}

// StepRequest is one batch of commands run in order in one short-lived
// sandbox made from Layers. Its writable layer is captured into UpperDir
// when every command succeeded.
type StepRequest struct {
	TeamID  string   // the team whose quota and policy apply
	BuildID string   // names the sandbox in logs and audit events
	Layers  []string // template layers, lowest first; never written
	// Commands run one after another through /bin/sh -c; the first that
	// exits non-zero ends the batch with an error naming its line.
	Commands []StepCommand
	// UpperDir receives the sandbox's writable layer (an overlay upper:
	// whiteouts and opaque directories as overlayfs writes them), stored
	// unshifted so it can be idmapped into any sandbox. It must not exist.
	UpperDir string
	// Resources for the step sandbox; a field over the team's quota is
	// refused. Zero fields take what a sandbox gets by default, capped at
	// the team's quota.
	CPUCount, MemoryMB, DiskMB int
	// Output receives the commands' stdout and stderr as they run.
	Output io.Writer
}

// StepCommand is one RUN step.
type StepCommand struct {
	Line    int               // Dockerfile line, for errors (0 if none)
	Cmd     string            // shell command
	User    string            // user to run as ("" = root)
	Workdir string            // working directory ("" = /)
	Env     map[string]string // environment on top of the image's
}

// ExitError is what a StepRunner returns for a command that exited
// non-zero: the builder reports its code beside the output's last lines.
type ExitError struct {
	Line int    // Dockerfile line (0 if none)
	Cmd  string // the command
	Code int
}

func (e *ExitError) Error() string { return fmt.Sprintf("%q exited with code %d", e.Cmd, e.Code) }

// ExitCode is the command's exit code.
func (e *ExitError) ExitCode() int { return e.Code }

// LimitError is a RUN step stopped by a limit of its sandbox (memory,
// processes, disk: the team's quota or a build step's default under it).
// StepRunners return it around the command's error so the build's failure
// says which limit and how to raise it, not only an exit code.
type LimitError struct {
	Msg string // what was hit and how to raise it
	Err error  // the command's *ExitError, or why it ended
}

func (e *LimitError) Error() string { return e.Msg }

func (e *LimitError) Unwrap() []error { return []error{e.Err, errdefs.ErrResourceExhausted} }
