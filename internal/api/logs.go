package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// applyIsolation copies the agentbox extension fields of a create body into
// the request; the manager resolves defaults and checks quotas.
func applyIsolation(req *sandbox.CreateRequest, b rest.NewSandbox) error {
	if b.Isolation != nil {
		req.Isolation = strings.TrimSpace(*b.Isolation)
		if req.Isolation == "" {
			return invalid("isolation: empty; use one of %s or omit it", strings.Join(sandbox.Isolations(), ", "))
		}
		// Checked here, not only by the backend, so both server modes
		// refuse an unknown tier alike.
		if !slices.Contains(sandbox.Isolations(), req.Isolation) {
			return invalid("isolation: %q is not a tier; use one of %s", apireq.Truncate(req.Isolation), strings.Join(sandbox.Isolations(), ", "))
		}
	}
	for _, f := range []struct {
		v   *int
		dst *int
	}{
		{b.CPUCount, &req.Limits.CPUCount}, {b.MemoryMB, &req.Limits.MemoryMB}, {b.DiskSizeMB, &req.Limits.DiskMB},
		{b.PIDs, &req.Limits.PIDs}, {b.TmpSizeMB, &req.Limits.TmpMB},
	} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if b.MaxCommandSeconds != nil {
		if *b.MaxCommandSeconds <= 0 {
			return invalid("maxCommandSeconds: %d; give a positive number of seconds or omit it for the server's cap", *b.MaxCommandSeconds)
		}
		req.MaxCommand = time.Duration(*b.MaxCommandSeconds) * time.Second
	}
	return nil
}

// logsRoutes serves the audit log of a sandbox in E2B's log shapes.
func (s *Server) logsRoutes(auth func(string, http.HandlerFunc)) {
	auth("GET /sandboxes/{id}/logs", s.logs(false))
	auth("GET /v2/sandboxes/{id}/logs", s.logs(true))
}

const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
)

func (s *Server) logs(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		al := s.mgr.Audit()
		if al == nil {
			httperr.Write(w, fmt.Errorf("this server keeps no audit log: %w", errdefs.ErrUnavailable))
			return
		}
		key := keyOf(r.Context())
		id := sandboxID(r)
		q := r.URL.Query()
		aq := audit.Query{SandboxID: id, TeamID: key.TeamID, Limit: defaultLogLimit}
		// E2B: v1 "start", v2 "cursor", both unix milliseconds.
		for _, name := range []string{"start", "cursor"} {
			if v := q.Get(name); v != "" {
				ms, err := strconv.ParseInt(v, 10, 64)
				if err != nil || ms < 0 {
					httperr.Write(w, invalid("%s: must be unix milliseconds, got %q", name, apireq.Truncate(v)))
					return
				}
				aq.Since = time.UnixMilli(ms)
			}
		}
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxLogLimit {
				httperr.Write(w, invalid("limit: must be an integer from 1 to %d, got %q", maxLogLimit, apireq.Truncate(v)))
				return
			}
			aq.Limit = n
		}
		if v := q.Get("kind"); v != "" {
			aq.Kinds = strings.Split(v, ",")
		}
		events, err := al.Query(r.Context(), aq)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		if len(events) == 0 {
			// No events: either a sandbox of another team, or one that does
			// not exist; the same 404 for both.
			if _, err := s.mgr.Get(r.Context(), key.TeamID, id); err != nil {
				httperr.Write(w, err)
				return
			}
		}
		if q.Get("follow") == "true" || q.Get("follow") == "1" {
			s.followLogs(w, r, al, aq, events)
			return
		}
		entries := make([]rest.SandboxLogEntry, 0, len(events))
		for _, e := range events {
			entries = append(entries, toLogEntry(e))
		}
		if v2 {
			httperr.WriteJSON(w, http.StatusOK, rest.SandboxLogsV2{Logs: entries})
			return
		}
		lines := make([]rest.SandboxLog, 0, len(entries))
		for _, e := range entries {
			lines = append(lines, rest.SandboxLog{Timestamp: e.Timestamp, Line: e.Message})
		}
		httperr.WriteJSON(w, http.StatusOK, rest.SandboxLogs{LogEntries: entries, Logs: lines})
	}
}

// followLogs streams entries as NDJSON (an agentbox extension): first the
// stored ones, then new ones as they are appended, until the client leaves.
func (s *Server) followLogs(w http.ResponseWriter, r *http.Request, al *audit.Log, aq audit.Query, past []audit.Event) {
	live, cancel := al.Subscribe(aq.SandboxID)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	var last int64
	write := func(e audit.Event) bool {
		if e.Seq <= last || (e.TeamID != aq.TeamID) || (len(aq.Kinds) > 0 && !slices.Contains(aq.Kinds, e.Kind)) {
			return true
		}
		last = e.Seq
		return enc.Encode(toLogEntry(e)) == nil
	}
	for _, e := range past {
		write(e)
	}
	// Events appended between the query and the subscription.
	if gap, err := al.Query(r.Context(), audit.Query{SandboxID: aq.SandboxID, TeamID: aq.TeamID, AfterSeq: last}); err == nil {
		for _, e := range gap {
			write(e)
		}
	}
	_ = rc.Flush()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-live:
			if !ok || !write(e) {
				return
			}
			_ = rc.Flush()
		case <-keepalive.C:
			// A blank line keeps proxies from closing an idle stream.
			if _, err := w.Write([]byte("\n")); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}
}

// toLogEntry is E2B's SandboxLogEntry of an event; fields are strings on
// the wire.
func toLogEntry(e audit.Event) rest.SandboxLogEntry {
	f := map[string]string{"kind": e.Kind, "action": e.Action, "seq": strconv.FormatInt(e.Seq, 10)}
	if e.Decision != "" {
		f["decision"] = e.Decision
	}
	if e.Reason != "" {
		f["reason"] = e.Reason
	}
	if e.APIKeyID != "" {
		f["apiKeyID"] = e.APIKeyID
	}
	for k, v := range e.Fields {
		if s, ok := v.(string); ok {
			f[k] = s
			continue
		}
		b, _ := json.Marshal(v)
		f[k] = string(b)
	}
	level := "info"
	switch {
	case e.Action == "unhealthy":
		level = "error"
	case e.Decision == audit.Denied || e.Kind == audit.KindLimit:
		level = "warn"
	}
	return rest.SandboxLogEntry{Timestamp: e.Time, Level: level, Message: Describe(e), Fields: f}
}

// Describe renders an event as one line a person or an agent can read.
func Describe(e audit.Event) string {
	str := func(k string) string {
		switch v := e.Fields[k].(type) {
		case string:
			return v
		case nil:
			return ""
		default:
			b, _ := json.Marshal(v)
			return string(b)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Kind, e.Action)
	switch e.Kind {
	case audit.KindProcess:
		if c := str("cmd"); c != "" {
			fmt.Fprintf(&b, ": %s", c)
			if a, ok := e.Fields["args"].([]any); ok && len(a) > 0 {
				for _, x := range a {
					fmt.Fprintf(&b, " %v", x)
				}
			}
		}
		for _, k := range []string{"user", "cwd", "pid", "exitCode", "status", "durationMs"} {
			if v := str(k); v != "" {
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		}
	case audit.KindFile:
		for _, k := range []string{"path", "from", "to", "user", "status"} {
			if v := str(k); v != "" {
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		}
	}
	if e.Decision == audit.Denied {
		b.WriteString(" [denied]")
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, ": %s", e.Reason)
	}
	return b.String()
}
