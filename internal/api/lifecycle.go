package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// lifecycleRoutes serves forks and warm pools on a local server (pause,
// resume and snapshots are sandboxRoutes).
func (s *Server) lifecycleRoutes(auth func(string, http.HandlerFunc)) {
	auth("POST /sandboxes/{id}/fork", s.fork)
	auth("GET /pools", s.pools)
}

// applyLifecycle maps E2B's autoPause/autoPauseMemory/autoResume (and our
// idleTimeout) onto the create request.
func applyLifecycle(req *sandbox.CreateRequest, b rest.NewSandbox) error {
	lr := &req.Lifecycle
	lr.AutoPause = b.AutoPause != nil && *b.AutoPause
	lr.AutoResume = b.AutoResume != nil && b.AutoResume.Enabled
	if b.AutoPauseMemory != nil {
		if !lr.AutoPause && !*b.AutoPauseMemory {
			return invalid("autoPauseMemory: only meaningful with autoPause: true")
		}
		lr.AutoPauseFS = !*b.AutoPauseMemory
		if lr.AutoPauseFS && lr.AutoResume {
			return invalid("autoResume: cannot be enabled with autoPauseMemory: false (a filesystem-only pause must be resumed explicitly)")
		}
	}
	if b.IdleTimeout != nil {
		if *b.IdleTimeout < 0 || *b.IdleTimeout > 1<<31-1 {
			return invalid("idleTimeout: must be from 0 to 2147483647 seconds, got %d", *b.IdleTimeout)
		}
		lr.IdleTimeout = time.Duration(*b.IdleTimeout) * time.Second
	}
	return nil
}

// stateOf is the E2B state of a sandbox: running or paused. Transitions
// show the state they leave until they are complete.
func stateOf(sb *sandbox.Sandbox) string {
	if sb.State.Paused() {
		return "paused"
	}
	return "running"
}

// endAt is when the sandbox ends; a paused one has its remaining lifetime
// on hold, shown as if it resumed now.
func endAt(sb *sandbox.Sandbox) time.Time {
	if sb.State == sandbox.StatePaused {
		return time.Now().UTC().Add(sb.TimeLeft).Truncate(time.Second)
	}
	return sb.EndAt.UTC()
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var body rest.PauseRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	memory := body.Memory == nil || *body.Memory
	if err := s.be.Pause(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), memory); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resume is the deprecated POST /sandboxes/{id}/resume: 201 with the
// sandbox when it was paused, 409 when it is running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	var body rest.ResumedSandbox
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	d, err := timeoutOf(body.Timeout, 15*time.Second)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	sb, resumed, err := s.resumeWith(r, body.Memory, d)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if !resumed {
		httperr.Write(w, fmt.Errorf("sandbox %q is already running: %w", sb.ID, errdefs.ErrConflict))
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, s.sandboxResponse(r.Context(), sb))
}

func snapshotOut(sn *sandbox.Snapshot) rest.SnapshotInfo {
	return rest.SnapshotInfo{SnapshotID: sn.SnapshotRef(), Names: []string{sn.SnapshotRef()}}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var body rest.SnapshotRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	name := ""
	if body.Name != nil {
		name = *body.Name
		if name == "" || len(name) > 128 || !snapshotName(name) {
			httperr.Write(w, invalid("name: use 1-128 lowercase letters, digits, '-' and '_'"))
			return
		}
	}
	team := keyOf(r.Context()).TeamID
	// The sandbox must be the caller's before anything named is replaced.
	if _, err := s.be.Get(r.Context(), team, sandboxID(r)); err != nil {
		httperr.Write(w, err)
		return
	}
	if name != "" {
		// E2B assigns a new build to the existing name; ours are
		// immutable, so the old one is replaced.
		if _, err := s.be.DeleteSnapshot(r.Context(), team, name); err != nil {
			httperr.Write(w, err)
			return
		}
	}
	sn, err := s.be.CreateSnapshot(r.Context(), team, sandboxID(r), name, body.Memory == nil || *body.Memory)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, snapshotOut(sn))
}

func snapshotName(s string) bool {
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := apireq.SnapshotLimit(q)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	all, err := s.be.ListSnapshots(r.Context(), keyOf(r.Context()).TeamID, q.Get("sandboxID"), q.Get("name"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	page, next := apireq.Page(all, func(sn *sandbox.Snapshot) string { return sn.ID }, q.Get("nextToken"), limit)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	out := make([]rest.SnapshotInfo, 0, len(page))
	for _, sn := range page {
		out = append(out, snapshotOut(sn))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// deleteSnapshot serves DELETE /templates/{id} (the SDK's deleteSnapshot)
// when id names one of the team's snapshots; it reports whether it did.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) bool {
	found, err := s.be.DeleteSnapshot(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("id"))
	switch {
	case err != nil:
		httperr.Write(w, err)
	case found:
		w.WriteHeader(http.StatusNoContent)
	}
	return found || err != nil
}

// deleteSnapshotOnly is DELETE /templates/{id} where templates are not
// served (NewE2B): the caller's snapshot, else the 404 of a local server
// that has no template by that id either.
func (s *Server) deleteSnapshotOnly(w http.ResponseWriter, r *http.Request) {
	if !s.deleteSnapshot(w, r) {
		httperr.Write(w, fmt.Errorf("template %q: %w", r.PathValue("id"), errdefs.ErrNotFound))
	}
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var body rest.ForkRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	count := int64(1)
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > sandbox.MaxForks {
		httperr.Write(w, invalid("count: must be from 1 to %d, got %d", sandbox.MaxForks, count))
		return
	}
	d, err := timeoutOf(body.Timeout, 15*time.Second)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	res, err := s.mgr.Snapshots().Fork(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), int(count), d)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := make([]rest.ForkResult, len(res))
	for i, fr := range res {
		if fr.Err != nil {
			st := httperr.Status(fr.Err)
			out[i].Error = &rest.Error{Code: st, Message: httperr.Message(fr.Err)}
			continue
		}
		sr := s.sandboxResponse(r.Context(), fr.Sandbox)
		out[i].Sandbox = &sr
	}
	httperr.WriteJSON(w, http.StatusCreated, out)
}

// pools reports the warm pools (agentbox extension) as the caller's team
// may see them: configuration and its own claims, nothing other teams did.
func (s *Server) pools(w http.ResponseWriter, r *http.Request) {
	pools := s.mgr.Pools().Team(keyOf(r.Context()).TeamID)
	out := make([]rest.PoolStats, 0, len(pools))
	for _, p := range pools {
		out = append(out, poolStats(p))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}
