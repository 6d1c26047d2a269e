package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/template"
)

// Isolation tiers as clients name them (runtime's tier table has each).
const (
	IsolationContainer = runtime.IsolationContainer
	IsolationGVisor    = runtime.IsolationGVisor
	IsolationMicroVM   = runtime.IsolationMicroVM
)

// MetadataIsolation is the metadata key clients that cannot send extension
// fields (the E2B SDKs) use to pick a tier.
const MetadataIsolation = "agentbox.isolation"

// MetadataLazyResume ("on" or "off") overrides the server's rule for
// whether a resume of the sandbox runs it before its memory is loaded
// (agentbox serve --lazy-resume-mb).
const MetadataLazyResume = "agentbox.lazyResume"

// lazyResume is the restore option the sandbox's metadata asks for.
func lazyResume(md map[string]string) runtime.Lazy {
	switch md[MetadataLazyResume] {
	case "on":
		return runtime.LazyAlways
	case "off":
		return runtime.LazyNever
	}
	return runtime.LazyAuto
}

// Isolations lists the tiers clients may ask for, the default first.
func Isolations() []string { return runtime.Isolations() }

// RuntimeTier maps a client-facing tier to the runtime driver's name.
func RuntimeTier(isolation string) string { return runtime.RuntimeOf(isolation) }

// Limits are per-sandbox resource limits; a zero field takes the template's
// (or the server's) default.
type Limits struct {
	CPUCount int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	DiskMB   int `json:"diskSizeMB"`
	PIDs     int `json:"pids"`
	TmpMB    int `json:"tmpSizeMB"`
}

// Server defaults for limits templates do not set.
const (
	DefaultPIDs  = 4096
	DefaultTmpMB = 0 // /tmp on the writable layer, bounded by the disk limit
)

// resolveIsolation picks the tier: request, then template, then container.
func (s *starter) resolveIsolation(req CreateRequest, tpl *template.Template) (string, error) {
	iso := req.Isolation
	if iso == "" {
		iso = req.Metadata[MetadataIsolation]
	}
	if iso == "" {
		iso = tpl.Isolation
	}
	if iso == "" {
		iso = runtime.DefaultIsolation()
	}
	if !slices.Contains(Isolations(), iso) {
		return "", fmt.Errorf("isolation: %q is not a tier; use one of %s: %w", truncateID(iso), strings.Join(Isolations(), ", "), errdefs.ErrInvalidArgument)
	}
	if tc, ok := s.rt.(runtime.TierChecker); ok {
		if err := tc.TierAvailable(RuntimeTier(iso)); err != nil {
			if errors.Is(err, errdefs.ErrUnavailable) {
				// The client can act on it (pick another tier), so it is a 400.
				return "", fmt.Errorf("isolation %q: %s: %w", iso, strings.TrimSuffix(err.Error(), ": "+errdefs.ErrUnavailable.Error()), errdefs.ErrInvalidArgument)
			}
			return "", err
		}
	} else if def := runtime.DefaultIsolation(); iso != def {
		return "", fmt.Errorf("isolation %q: this server's runtime only runs %q: %w", iso, def, errdefs.ErrInvalidArgument)
	}
	return iso, nil
}

func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// resolveLimits merges request, template and server defaults and checks
// the result against the team's quota q (teamQuota).
func resolveLimits(req Limits, tpl *template.Template, q Quota) (Limits, error) {
	l := Limits{CPUCount: tpl.CPUCount, MemoryMB: tpl.MemoryMB, DiskMB: tpl.DiskMB, PIDs: DefaultPIDs, TmpMB: DefaultTmpMB}
	type field struct {
		name    string
		asked   int
		dst     *int
		quota   int
		min     int
		unit    string
		whatFor string
		// server: the default is the server's, not the template's; a
		// team quota below it lowers it instead of refusing the create.
		server bool
	}
	for _, f := range []field{
		{"cpuCount", req.CPUCount, &l.CPUCount, q.CPUCount, 1, "CPUs", "CPU time", false},
		{"memoryMB", req.MemoryMB, &l.MemoryMB, q.MemoryMB, 64, "MiB", "memory", false},
		{"diskSizeMB", req.DiskMB, &l.DiskMB, q.DiskMB, 64, "MiB", "the writable disk", false},
		{"pids", req.PIDs, &l.PIDs, q.PIDs, 16, "processes", "processes and threads", true},
		{"tmpSizeMB", req.TmpMB, &l.TmpMB, q.TmpMB, 1, "MiB", "/tmp", true},
	} {
		if f.asked < 0 {
			return l, fmt.Errorf("%s: must not be negative, got %d: %w", f.name, f.asked, errdefs.ErrInvalidArgument)
		}
		if f.asked > 0 {
			if f.asked < f.min {
				return l, fmt.Errorf("%s: %d %s is below the minimum of %d: %w", f.name, f.asked, f.unit, f.min, errdefs.ErrInvalidArgument)
			}
			*f.dst = f.asked
		} else if f.server && f.quota > 0 {
			*f.dst = min(*f.dst, f.quota)
		}
		if f.quota > 0 && *f.dst > f.quota {
			return l, fmt.Errorf("%s: %d %s is over the team quota of %d %s for %s; ask for at most %d: %w",
				f.name, *f.dst, f.unit, f.quota, f.unit, f.whatFor, f.quota, errdefs.ErrInvalidArgument)
		}
	}
	if l.TmpMB > 0 && l.MemoryMB > 0 && l.TmpMB > l.MemoryMB {
		return l, fmt.Errorf("tmpSizeMB: %d MiB is over the sandbox's memory limit of %d MiB, and /tmp is kept in memory; lower tmpSizeMB or raise memoryMB: %w", l.TmpMB, l.MemoryMB, errdefs.ErrInvalidArgument)
	}
	return l, nil
}

// resources converts limits to the runtime's form.
func (l Limits) resources() runtime.Resources {
	return runtime.Resources{CPUCount: l.CPUCount, MemoryMB: l.MemoryMB, DiskMB: l.DiskMB, PIDs: l.PIDs, TmpMB: l.TmpMB}
}
