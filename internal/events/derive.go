package events

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/store"
)

// Info is what an event says about its sandbox besides the event itself.
// The Service keeps it with each event, so the killed event of a sandbox
// the manager no longer holds still names its template and metadata.
type Info struct {
	TemplateID  string            `json:"templateID,omitempty"`
	BuildID     string            `json:"buildID,omitempty"`
	ExecutionID string            `json:"executionID,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	StartedAt   time.Time         `json:"startedAt,omitzero"`
	CPUCount    int               `json:"cpuCount,omitempty"`
	MemoryMB    int               `json:"memoryMB,omitempty"`
}

// auditKinds are the audit rows events are made from.
var auditKinds = []string{audit.KindLifecycle, audit.KindEgress, audit.KindSyscall, audit.KindLimit, audit.KindFile}

// hiddenTeam owns warm pool members: they are nobody's sandboxes until
// claimed (the claim is their created event).
const hiddenTeam = "agentbox-warm-pool"

// lifecycleType maps a lifecycle audit row to an event type ("" = none).
func lifecycleType(r store.AuditRow, fields map[string]any) string {
	if r.SandboxID == "" || r.TeamID == "" || r.TeamID == hiddenTeam {
		return ""
	}
	// A template build's RUN steps run in a hidden sandbox of the team.
	if _, ok := fields["build"]; ok {
		return ""
	}
	if p, _ := fields["path"].(string); p == "build" {
		return ""
	}
	if r.Action == "remove" {
		return TypeKilled
	}
	if r.Decision != audit.Allowed {
		return ""
	}
	return allowedType(r.Action)
}

// allowedType is the event type of a lifecycle action that counts once
// allowed (a removal counts whatever its decision).
func allowedType(action string) string {
	switch action {
	case "create":
		return TypeCreated
	case "resume":
		return TypeResumed
	case "pause":
		return TypePaused
	case "update":
		return TypeUpdated
	case "snapshot":
		return TypeCheckpointed
	}
	return ""
}

// killReason names why a sandbox ended the way E2B's kill_reason does
// where the two agree ("request", "timeout"), else in agentbox's words.
func killReason(why string) string {
	switch why {
	case "killed":
		return "request"
	case "timeout expired", "idle timeout":
		return "timeout"
	case "":
		return "unknown"
	}
	return why
}

// violationRule maps a policy audit row to its rule ("" = not a violation)
// and how many refusals it stands for.
func violationRule(r store.AuditRow, fields map[string]any) (rule string, count int64) {
	if r.SandboxID == "" || r.TeamID == "" || r.TeamID == hiddenTeam {
		return "", 0
	}
	count = 1
	if n, ok := fields["count"].(float64); ok && n >= 1 {
		count = int64(n)
	}
	switch r.Kind {
	case audit.KindEgress:
		if r.Decision != audit.Denied {
			return "", 0
		}
		return "egress", count
	case audit.KindSyscall:
		return "syscall", count
	case audit.KindFile:
		// A file call the sandbox refused for its path: no permission
		// there (a read-only or root-owned path for the calling user).
		// A missing file is an answer, not a refusal.
		if st, _ := fields["status"].(float64); r.Decision != audit.Denied || int(st) != http.StatusForbidden {
			return "", 0
		}
		return "path", 1
	case audit.KindLimit:
		switch r.Action {
		case "oom":
			if n, ok := fields["killed"].(float64); ok && n >= 1 {
				count = int64(n)
			}
		case "pids":
			if n, ok := fields["refused"].(float64); ok && n >= 1 {
				count = int64(n)
			}
		case "disk":
		default:
			return "", 0
		}
		return r.Action, count
	}
	return "", 0
}

// maxSamples bounds the distinct reasons one violation event lists.
const maxSamples = 5

// maxSampleBytes bounds one listed reason.
const maxSampleBytes = 300

// violations aggregates policy violations per sandbox and rule: the first
// of a window is reported at once, the rest of the window as one event
// with their count when it ends, so a sandbox that keeps hitting a wall
// costs at most one event per rule and window.
type violations struct {
	window time.Duration
	max    int // windows held at once; past it new ones report but are not held

	mu   sync.Mutex
	open map[violationKey]*violationWindow
}

type violationKey struct{ team, sandbox, rule string }

type violationWindow struct {
	start       time.Time
	count       int64
	first, last time.Time
	samples     []string
}

// violation is one event's worth of a rule's refusals.
type violation struct {
	key         violationKey
	count       int64
	first, last time.Time
	samples     []string
}

func newViolations(window time.Duration, max int) *violations {
	return &violations{window: window, max: max, open: map[violationKey]*violationWindow{}}
}

func sample(reason string) string {
	reason = strings.TrimSpace(reason)
	if len(reason) > maxSampleBytes {
		reason = strings.ToValidUTF8(reason[:maxSampleBytes], "") + "…"
	}
	return reason
}

// observe counts one row's refusals; it returns the violation to report
// now when the row opens a window.
func (v *violations) observe(now time.Time, k violationKey, count int64, at time.Time, reason string) *violation {
	v.mu.Lock()
	defer v.mu.Unlock()
	if w, ok := v.open[k]; ok {
		if w.count == 0 {
			w.first = at
		}
		w.count += count
		w.last = at
		if s := sample(reason); s != "" && len(w.samples) < maxSamples && !contains(w.samples, s) {
			w.samples = append(w.samples, s)
		}
		return nil
	}
	if len(v.open) < v.max {
		v.open[k] = &violationWindow{start: now}
	}
	var samples []string
	if s := sample(reason); s != "" {
		samples = []string{s}
	}
	return &violation{key: k, count: count, first: at, last: at, samples: samples}
}

// due returns the counts of windows that ended by now and starts the next
// window of each rule that was hit in it; a window without refusals closes.
func (v *violations) due(now time.Time) []violation {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []violation
	for k, w := range v.open {
		if now.Sub(w.start) < v.window {
			continue
		}
		if w.count == 0 {
			delete(v.open, k)
			continue
		}
		out = append(out, violation{key: k, count: w.count, first: w.first, last: w.last, samples: w.samples})
		*w = violationWindow{start: now}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first.Before(out[j].first) })
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func (x violation) data() map[string]any {
	d := map[string]any{
		"rule":     x.key.rule,
		"count":    x.count,
		"first_at": x.first.UTC().Format(time.RFC3339Nano),
		"last_at":  x.last.UTC().Format(time.RFC3339Nano),
	}
	if len(x.samples) > 0 {
		d["reasons"] = x.samples
	}
	return d
}

// fieldsOf parses an audit row's fields (JSON); a malformed one is empty.
func fieldsOf(r store.AuditRow) map[string]any {
	m := map[string]any{}
	if r.Fields != "" && r.Fields != "{}" {
		_ = json.Unmarshal([]byte(r.Fields), &m)
	}
	return m
}
