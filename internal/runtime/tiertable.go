package runtime

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Isolation tiers as clients name them (the create body's isolation, the
// agentbox.isolation metadata key, a Kubernetes runtimeClassName).
const (
	IsolationContainer = "container" // hardened runc: namespaces, seccomp, minimal caps
	IsolationGVisor    = "gvisor"    // gVisor runsc: a user-space kernel between the sandbox and the host
	IsolationMicroVM   = "microvm"   // QEMU microvm: a guest kernel of its own per sandbox
)

// TierInfo is what the rest of the server knows of one isolation tier:
// its names and its traits. The driver itself registers as a Tier under
// Runtime (tiers.go); what it can do beyond Runtime (pause, fork, move,
// freeze) is the optional interfaces it implements, which the manager
// asks for.
type TierInfo struct {
	// Isolation is the name clients use.
	Isolation string
	// Runtime is the driver's name (Spec.Runtime, Tier.Name).
	Runtime string
	// ReadyWait is the least time envd may take to answer after a start
	// or restore: a tier that boots a kernel of its own first needs more
	// than the server's --envd-ready-wait. Zero: the server's.
	ReadyWait time.Duration
	// OOMHint is added to the reason of an out-of-memory event when the
	// tier handles one differently from a plain container ("" none).
	OOMHint string
}

// tierTable lists the tiers, the default first. Adding a tier is its
// driver package (registered in cmd/agentbox's newRuntime) and one entry
// here.
func tierTable() []TierInfo {
	return []TierInfo{
		{
			Isolation: IsolationContainer, Runtime: "runc",
		},
		{
			Isolation: IsolationGVisor, Runtime: "runsc",
			OOMHint: "under gvisor the whole sandbox may have been stopped",
		},
		{
			Isolation: IsolationMicroVM, Runtime: "microvm",
			// The guest kernel boots first, under software emulation on
			// hosts without KVM.
			ReadyWait: 90 * time.Second,
		},
	}
}

// TierInfos lists every tier, the default first.
func TierInfos() []TierInfo { return tierTable() }

// DefaultIsolation is the tier of a sandbox that names none.
func DefaultIsolation() string { return tierTable()[0].Isolation }

// Isolations lists the tier names clients may ask for, the default first.
func Isolations() []string {
	t := tierTable()
	names := make([]string, len(t))
	for i, ti := range t {
		names[i] = ti.Isolation
	}
	return names
}

// TierOf returns the tier clients call isolation ("" is the default).
func TierOf(isolation string) (TierInfo, bool) {
	t := tierTable()
	if isolation == "" {
		return t[0], true
	}
	i := slices.IndexFunc(t, func(ti TierInfo) bool { return ti.Isolation == isolation })
	if i < 0 {
		return TierInfo{}, false
	}
	return t[i], true
}

// RuntimeOf maps a client-facing tier to its driver's name; an unknown or
// empty one maps to the default tier's driver.
func RuntimeOf(isolation string) string {
	if ti, ok := TierOf(isolation); ok {
		return ti.Runtime
	}
	return tierTable()[0].Runtime
}

// IsolationOfClass maps a Kubernetes runtimeClassName to the tier's
// client-facing name: either of its names.
// The error names every accepted one.
func IsolationOfClass(class string) (string, error) {
	var accepted []string
	for _, ti := range tierTable() {
		if class == ti.Isolation || class == ti.Runtime {
			return ti.Isolation, nil
		}
		accepted = append(accepted, fmt.Sprintf("%s (%s)", ti.Isolation, ti.Runtime))
	}
	return "", fmt.Errorf("runtimeClassName %q: agentbox runs %s: %w", class, strings.Join(accepted, ", "), errdefs.ErrInvalidArgument)
}
