package api

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/usage"
)

// defaultUsageWindow is the window GET /usage covers without from.
const defaultUsageWindow = 30 * 24 * time.Hour

func (s *Server) usageRoutes(auth func(string, http.HandlerFunc)) {
	auth("GET /usage", s.usage)
	auth("GET /teams/{teamID}/usage", func(w http.ResponseWriter, r *http.Request) {
		// Another team's id answers exactly as an unknown one.
		if id := r.PathValue("teamID"); id != keyOf(r.Context()).TeamID {
			httperr.Write(w, fmt.Errorf("team %q: not found: %w", apireq.Truncate(id), errdefs.ErrNotFound))
			return
		}
		s.usage(w, r)
	})
}

// usageWindow reads from and to (RFC 3339): to defaults to now, from to
// defaultUsageWindow before to.
func usageWindow(q url.Values, now time.Time) (from, to time.Time, err error) {
	to = now
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", &from}, {"to", &to}} {
		if v := q.Get(f.name); v != "" {
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				return from, to, invalid("%s: must be an RFC 3339 timestamp such as 2026-01-02T15:04:05Z, got %q", f.name, apireq.Truncate(v))
			}
			*f.dst = t
		}
	}
	if from.IsZero() {
		from = to.Add(-defaultUsageWindow)
	}
	if from.After(to) {
		return from, to, invalid("from: %s is after to (%s); give from <= to", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	return from.UTC(), to.UTC(), nil
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	from, to, err := usageWindow(r.URL.Query(), time.Now())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	team := keyOf(r.Context()).TeamID
	rows, err := s.store.Usage(r.Context(), team, from, to)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, usageResponse(team, from, to, rows))
}

func usageResponse(team string, from, to time.Time, rows []usage.Row) rest.TeamUsage {
	out := rest.TeamUsage{TeamID: team, From: from, To: to, Sandboxes: []rest.SandboxUsage{}}
	for _, r := range rows {
		out.Totals.CPUSeconds += r.CPUSeconds
		out.Totals.MemoryGiBSeconds += r.MemoryGiBSeconds
		out.Totals.EgressBytes += r.EgressBytes
		if r.Kind == usage.KindSnapshot {
			out.Totals.SnapshotGiBHours += r.DiskGiBHours
			continue
		}
		out.Totals.DiskGiBHours += r.DiskGiBHours
		out.Sandboxes = append(out.Sandboxes, rest.SandboxUsage{SandboxID: r.ID, TemplateID: r.TemplateID, CPUSeconds: r.CPUSeconds,
			MemoryGiBSeconds: r.MemoryGiBSeconds, DiskGiBHours: r.DiskGiBHours, EgressBytes: r.EgressBytes})
	}
	return out
}
