package api

import (
	"testing"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestApplyLifecycleFilesystemOnly(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name      string
		autoPause *bool
		memory    *bool
		wantFS    bool
	}{
		{name: "memory pause by default", autoPause: &yes},
		{name: "autoPauseMemory true", autoPause: &yes, memory: &yes},
		{name: "autoPauseMemory false", autoPause: &yes, memory: &no, wantFS: true},
		{name: "no autoPause", memory: &yes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req sandbox.CreateRequest
			if err := applyLifecycle(&req, rest.NewSandbox{AutoPause: tc.autoPause, AutoPauseMemory: tc.memory}); err != nil {
				t.Fatal(err)
			}
			if req.Lifecycle.AutoPauseFS != tc.wantFS {
				t.Fatalf("AutoPauseFS = %v, want %v", req.Lifecycle.AutoPauseFS, tc.wantFS)
			}
		})
	}
}
