package runtime

import (
	"errors"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestTierTable(t *testing.T) {
	if got := Isolations(); !slices.Equal(got, []string{IsolationContainer, IsolationGVisor, IsolationMicroVM}) {
		t.Fatalf("Isolations() = %v", got)
	}
	if DefaultIsolation() != IsolationContainer {
		t.Fatalf("default tier %q", DefaultIsolation())
	}
	for _, tc := range []struct{ isolation, runtime string }{
		{"", "runc"}, {IsolationContainer, "runc"}, {IsolationGVisor, "runsc"}, {IsolationMicroVM, "microvm"}, {"kata", "runc"},
	} {
		if got := RuntimeOf(tc.isolation); got != tc.runtime {
			t.Errorf("RuntimeOf(%q) = %q, want %q", tc.isolation, got, tc.runtime)
		}
	}
	for _, tc := range []struct {
		class, isolation string
		err              error
	}{
		{"container", IsolationContainer, nil}, {"runc", IsolationContainer, nil},
		{"gvisor", IsolationGVisor, nil}, {"runsc", IsolationGVisor, nil},
		{"microvm", IsolationMicroVM, nil},
		{"kata", "", errdefs.ErrInvalidArgument}, {"", "", errdefs.ErrInvalidArgument},
	} {
		got, err := IsolationOfClass(tc.class)
		if got != tc.isolation || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("IsolationOfClass(%q) = %q, %v; want %q, %v", tc.class, got, err, tc.isolation, tc.err)
		}
	}
	if ti, _ := TierOf(IsolationMicroVM); ti.ReadyWait == 0 {
		t.Error("the microvm tier boots a kernel first: it needs a ReadyWait")
	}
	if ti, _ := TierOf(IsolationGVisor); ti.OOMHint == "" {
		t.Error("the gvisor tier's OOM hint is missing")
	}
	if _, ok := TierOf("kata"); ok {
		t.Error("TierOf found an unknown tier")
	}
}
