package sandbox

import (
	"context"
	"strings"
	"testing"
)

func TestReadiness(t *testing.T) {
	e := newFakeEnv(t, LifecycleConfig{})
	ctx := context.Background()

	r := e.m.Readiness(ctx)
	if !r.Ready || r.Store != "ok" || r.Network != "ok" || r.Tiers[IsolationContainer] != "ok" {
		t.Fatalf("healthy server not ready: %+v", r)
	}
	// gVisor is not installed on this fake host: reported, and optional.
	if got := r.Tiers[IsolationGVisor]; !strings.Contains(got, "not installed") {
		t.Errorf("gvisor tier = %q, want its reason", got)
	}

	e.h.Runtime.Tiers = []string{"runsc"}
	if r := e.m.Readiness(ctx); r.Tiers[IsolationGVisor] != "ok" {
		t.Errorf("gvisor tier installed but reported %q", r.Tiers[IsolationGVisor])
	}

	// A store that no longer answers makes the server unready, with why.
	e.st.Close()
	r = e.m.Readiness(ctx)
	if r.Ready || !strings.Contains(r.Store, "database") {
		t.Fatalf("closed store: %+v, want not ready naming the database", r)
	}
}
