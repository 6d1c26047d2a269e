package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

// runStep runs one command as a build step of build buildID and returns
// the step sandbox's runtime spec (seen while it ran) and the error.
func (e *fakeEnv) runStep(t *testing.T, buildID, cmd string, req template.StepRequest) (runtime.Spec, error) {
	t.Helper()
	var spec runtime.Spec
	req.TeamID, req.BuildID, req.Layers = e.team, buildID, []string{"/layers/base"}
	req.UpperDir = filepath.Join(t.TempDir(), "upper")
	req.Commands = []template.StepCommand{{Line: 4, Cmd: cmd}}
	req.Output = writerFunc(func(p []byte) (int, error) {
		e.m.mu.Lock()
		defer e.m.mu.Unlock()
		for id, sb := range e.m.sandboxes {
			if sb.BuildID == buildID {
				spec, _ = e.h.Runtime.Spec(id)
			}
		}
		return len(p), nil
	})
	err := e.m.RunSteps(context.Background(), req)
	return spec, err
}

// TestBuildStepLimits: a build step's sandbox gets what a create would get
// by default, capped at the team's quota, or what the build asks within it.
func TestBuildStepLimits(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		quota store.TeamQuota
		req   template.StepRequest
		want  runtime.Resources
	}{
		{"server's quota: a sandbox's defaults", store.TeamQuota{}, template.StepRequest{},
			runtime.Resources{CPUCount: template.DefaultCPUCount, MemoryMB: template.DefaultMemoryMB, DiskMB: template.DefaultDiskMB, PIDs: DefaultPIDs}},
		{"small team: defaults capped at its quota", store.TeamQuota{CPUCount: 1, MemoryMB: 256, DiskMB: 128, PIDs: 100}, template.StepRequest{},
			runtime.Resources{CPUCount: 1, MemoryMB: 256, DiskMB: 128, PIDs: 100}},
		{"the build's own sizes within the quota", store.TeamQuota{MemoryMB: 4096}, template.StepRequest{CPUCount: 1, MemoryMB: 3072},
			runtime.Resources{CPUCount: 1, MemoryMB: 3072, DiskMB: template.DefaultDiskMB, PIDs: DefaultPIDs}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEnv(t, LifecycleConfig{})
			if tt.quota != (store.TeamQuota{}) {
				if err := e.st.SetTeamQuota(ctx, e.team, tt.quota); err != nil {
					t.Fatal(err)
				}
			}
			spec, err := e.runStep(t, "b1", "true", tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if spec.Resources != tt.want {
				t.Fatalf("step sandbox resources %+v, want %+v", spec.Resources, tt.want)
			}
			e.noLeaks(t)
		})
	}
}

// TestBuildStepLimitHits: a step that hits a limit fails saying which, of
// how much, and how to raise it; a step failing on its own does not.
func TestBuildStepLimitHits(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		quota store.TeamQuota
		cmd   string
		want  []string // in the error; nil: no limit named
	}{
		{"memory at the team's quota", store.TeamQuota{MemoryMB: 256}, "simulate oom",
			[]string{`line 4 "simulate oom" was killed: it used more than the team's memory quota of 256 MiB`, "--memory-mb N"}},
		{"memory under the quota", store.TeamQuota{}, "simulate oom",
			[]string{"the build step's memory limit of 1024 MiB", "memoryMB in the build request"}},
		{"disk at the team's quota", store.TeamQuota{DiskMB: 128}, "simulate disk-full",
			[]string{`wrote more than the team's disk quota of 128 MiB`, "--disk-mb N", "No space left on device"}},
		{"processes", store.TeamQuota{PIDs: 64}, "simulate pids",
			[]string{"the team's process quota of 64 processes and threads", "--pids N"}},
		{"a plain failure", store.TeamQuota{}, "exit 3", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEnv(t, LifecycleConfig{})
			if tt.quota != (store.TeamQuota{}) {
				if err := e.st.SetTeamQuota(ctx, e.team, tt.quota); err != nil {
					t.Fatal(err)
				}
			}
			_, err := e.runStep(t, "b1", tt.cmd, template.StepRequest{})
			if err == nil {
				t.Fatal("the step succeeded")
			}
			var le *template.LimitError
			if tt.want == nil {
				if errors.As(err, &le) {
					t.Fatalf("a plain failure names a limit: %v", err)
				}
				return
			}
			if !errors.As(err, &le) || !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("err = %v, want a LimitError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to say %q", err, w)
				}
			}
			var ec interface{ ExitCode() int }
			if !errors.As(err, &ec) || ec.ExitCode() == 0 {
				t.Errorf("the exit code is lost: %v", err)
			}
			e.noLeaks(t)
		})
	}
}

// TestAdmitBuild: a build in progress holds one of its team's maxSandboxes
// and maxBuilds from admission to release, its steps run in that slot, and
// a team at either limit is refused naming it.
func TestAdmitBuild(t *testing.T) {
	ctx := context.Background()
	admit := func(e *fakeEnv, id string) (func(), error) {
		return e.m.AdmitBuild(ctx, template.BuildAdmission{TeamID: e.team, BuildID: id})
	}

	t.Run("maxSandboxes", func(t *testing.T) {
		e := newFakeEnv(t, LifecycleConfig{})
		if err := e.st.SetTeamQuota(ctx, e.team, store.TeamQuota{MaxSandboxes: 1}); err != nil {
			t.Fatal(err)
		}
		release, err := admit(e, "b1")
		if err != nil {
			t.Fatal(err)
		}
		// The build's own step runs in its slot.
		if _, err := e.runStep(t, "b1", "true", template.StepRequest{}); err != nil {
			t.Fatalf("the admitted build's step: %v", err)
		}
		if _, err := e.m.Create(ctx, e.req()); !errors.Is(err, errdefs.ErrResourceExhausted) ||
			!strings.Contains(err.Error(), "1 of them template builds") {
			t.Fatalf("create while a build holds the last slot: %v", err)
		}
		if _, err := admit(e, "b2"); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "maxSandboxes") {
			t.Fatalf("second build past maxSandboxes: %v", err)
		}
		// A step of a build that was not admitted takes a slot of its own.
		if _, err := e.runStep(t, "b3", "true", template.StepRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("unadmitted build step past maxSandboxes: %v", err)
		}
		release()
		release() // twice is harmless
		sb := e.create(t, e.req())
		if _, err := admit(e, "b2"); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("build with the sandbox holding the last slot: %v", err)
		}
		if err := e.m.Kill(ctx, e.team, sb.ID); err != nil {
			t.Fatal(err)
		}
		release, err = admit(e, "b2")
		if err != nil {
			t.Fatalf("after the kill: %v", err)
		}
		release()
		e.noLeaks(t)
		if len(e.m.admission.builds) != 0 {
			t.Errorf("builds still admitted: %v", e.m.admission.builds)
		}
	})

	t.Run("maxBuilds", func(t *testing.T) {
		e := newFakeEnv(t, LifecycleConfig{})
		if err := e.st.SetTeamQuota(ctx, e.team, store.TeamQuota{MaxBuilds: 1}); err != nil {
			t.Fatal(err)
		}
		release, err := admit(e, "b1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admit(e, "b1"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("the same build twice: %v", err)
		}
		_, err = admit(e, "b2")
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "maxBuilds") || !strings.Contains(err.Error(), "--max-builds N") {
			t.Fatalf("second build past maxBuilds: %v", err)
		}
		// Another team is not affected.
		other, _ := e.st.EnsureTeam(ctx, "t2")
		r2, err := e.m.AdmitBuild(ctx, template.BuildAdmission{TeamID: other.ID, BuildID: "b9"})
		if err != nil {
			t.Fatalf("another team's build: %v", err)
		}
		r2()
		release()
		if release, err = admit(e, "b2"); err != nil {
			t.Fatalf("after the first ended: %v", err)
		}
		release()
	})

	t.Run("sizes over the quota", func(t *testing.T) {
		e := newFakeEnv(t, LifecycleConfig{})
		if err := e.st.SetTeamQuota(ctx, e.team, store.TeamQuota{MemoryMB: 512}); err != nil {
			t.Fatal(err)
		}
		_, err := e.m.AdmitBuild(ctx, template.BuildAdmission{TeamID: e.team, BuildID: "b1", MemoryMB: 1024})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "memoryMB: 1024 MiB is over the team quota of 512 MiB") {
			t.Fatalf("build asking over the quota: %v", err)
		}
		if len(e.m.admission.builds) != 0 {
			t.Errorf("a refused build is admitted: %v", e.m.admission.builds)
		}
	})
}
