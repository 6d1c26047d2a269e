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

// lifecycleRoutes serves pause/resume, snapshots, forks and warm pools.
// (POST /sandboxes/{id}/pause and /resume are registered in Handler.)
func (s *Server) lifecycleRoutes(auth func(string, http.HandlerFunc)) {
	auth("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	auth("GET /snapshots", s.listSnapshots)
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
	pause := s.mgr.Pause
	if body.Memory != nil && !*body.Memory {
		pause = s.mgr.PauseFilesystem
	}
	if err := pause(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r)); err != nil {
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
	httperr.WriteJSON(w, http.StatusCreated, s.sandboxResponse(sb))
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
		team := keyOf(r.Context()).TeamID
		if s.mgr.IsSnapshot(team, name) {
			// E2B assigns a new build to the existing name; ours are
			// immutable, so the old one is replaced.
			if err := s.mgr.DeleteSnapshot(r.Context(), team, name); err != nil {
				httperr.Write(w, err)
				return
			}
		}
	}
	snapshot := s.mgr.CreateSnapshot
	if body.Memory != nil && !*body.Memory {
		snapshot = s.mgr.CreateFilesystemSnapshot
	}
	sn, err := snapshot(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), name)
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
	all := s.mgr.ListSnapshots(r.Context(), keyOf(r.Context()).TeamID, q.Get("sandboxID"), q.Get("name"))
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
	ref := r.PathValue("id")
	team := keyOf(r.Context()).TeamID
	if !s.mgr.IsSnapshot(team, ref) {
		return false
	}
	if err := s.mgr.DeleteSnapshot(r.Context(), team, ref); err != nil {
		httperr.Write(w, err)
		return true
	}
	w.WriteHeader(http.StatusNoContent)
	return true
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
	res, err := s.mgr.Fork(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), int(count), d)
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
		sr := s.sandboxResponse(fr.Sandbox)
		out[i].Sandbox = &sr
	}
	httperr.WriteJSON(w, http.StatusCreated, out)
}

// pools reports the warm pools (agentbox extension) as the caller's team
// may see them: configuration and its own claims, nothing other teams did.
func (s *Server) pools(w http.ResponseWriter, r *http.Request) {
	pools := s.mgr.TeamPools(keyOf(r.Context()).TeamID)
	out := make([]rest.PoolStats, 0, len(pools))
	for _, p := range pools {
		out = append(out, poolStats(p))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}
