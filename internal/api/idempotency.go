package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
)

// IdempotencyHeader names a create, so that a client whose connection broke
// mid-create can retry and get the sandbox it asked for instead of leaking
// one: a create with the same key and body, by the same team, answers the
// first create's sandbox (waiting for it while it is still being made).
const IdempotencyHeader = "Idempotency-Key"

const (
	idemTTL    = 24 * time.Hour // how long a key answers
	idemKeyMax = 255            // bytes
	// IdempotencyKeysPerTeam is the default of how many keys each team's
	// cache holds (--idempotency-keys-per-team): past it, the team's own
	// oldest finished keys are forgotten, never another team's.
	IdempotencyKeysPerTeam = 1000
)

// idempotency remembers successful creates by (team, key), in memory: a
// restart forgets them (the sandboxes themselves survive it). Each team has
// a cache of its own with a cap of its own, so no team can push another's
// keys out by filling its cache.
type idempotency struct {
	mu      sync.Mutex
	perTeam int // keys per team; 0: IdempotencyKeysPerTeam
	teams   map[string]map[string]*idemEntry
}

type idemEntry struct {
	hash [32]byte      // of the request body
	done chan struct{} // closed when the first create ended
	ok   bool          // it succeeded: body is the answer
	body []byte
	at   time.Time
}

// begin claims (team, key) for a create of a body hashing to hash. owner
// says the caller makes the sandbox and must call finish; otherwise e is
// the first create's entry, to wait for. A key reused with another body is
// a conflict.
func (c *idempotency) begin(team, key string, hash [32]byte) (e *idemEntry, owner bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.teams == nil {
		c.teams = map[string]map[string]*idemEntry{}
	}
	entries := c.teams[team]
	if entries == nil {
		entries = map[string]*idemEntry{}
		c.teams[team] = entries
	}
	if e := entries[key]; e != nil && now.Sub(e.at) < idemTTL {
		if e.hash != hash {
			return nil, false, fmt.Errorf("%s: %q was used for a create with another body; use a new key for a new sandbox: %w", IdempotencyHeader, key, errdefs.ErrConflict)
		}
		return e, false, nil
	}
	limit := c.perTeam
	if limit <= 0 {
		limit = IdempotencyKeysPerTeam
	}
	if len(entries) >= limit {
		evict(entries, now, limit)
		if len(entries) >= limit {
			// Every slot is a create still running: the team's own
			// concurrency, not another team, has to end first.
			return nil, false, fmt.Errorf("%s: this team has %d creates with keys under way, its cache's limit (--idempotency-keys-per-team); retry when one ends: %w",
				IdempotencyHeader, len(entries), errdefs.ErrResourceExhausted)
		}
	}
	e = &idemEntry{hash: hash, done: make(chan struct{}), at: now}
	entries[key] = e
	return e, true, nil
}

// finish records the first create's answer. A failed create forgets the
// key: it changed nothing, and a retry runs again.
func (c *idempotency) finish(team, key string, e *idemEntry, body []byte, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.ok, e.body = ok, body
	if entries := c.teams[team]; !ok && entries[key] == e {
		delete(entries, key)
		if len(entries) == 0 {
			delete(c.teams, team)
		}
	}
	close(e.done)
}

// evict drops a team's expired entries, then its oldest finished ones
// until there is room under limit.
func evict(entries map[string]*idemEntry, now time.Time, limit int) {
	for key, e := range entries {
		if now.Sub(e.at) >= idemTTL {
			delete(entries, key)
		}
	}
	for len(entries) >= limit {
		var oldest string
		for key, e := range entries {
			select {
			case <-e.done:
				if oldest == "" || e.at.Before(entries[oldest].at) {
					oldest = key
				}
			default:
			}
		}
		if oldest == "" {
			return
		}
		delete(entries, oldest)
	}
}

// SetIdempotencyKeysPerTeam sets how many Idempotency-Key entries each
// team's cache holds; call before serving.
func (s *Server) SetIdempotencyKeysPerTeam(n int) { s.idem.perTeam = n }

// held is how many keys team's cache holds.
func (c *idempotency) held(team string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.teams[team])
}

// createOnce runs create under the request's Idempotency-Key, if any, and
// writes its answer.
func (s *Server) createOnce(w http.ResponseWriter, r *http.Request, body any, create func() (any, error)) {
	key := r.Header.Get(IdempotencyHeader)
	if key == "" {
		v, err := create()
		if err != nil {
			httperr.Write(w, err)
			return
		}
		httperr.WriteJSON(w, http.StatusCreated, v)
		return
	}
	if len(key) > idemKeyMax || !printable(key) {
		httperr.Write(w, invalid("%s: must be printable and at most %d bytes", IdempotencyHeader, idemKeyMax))
		return
	}
	raw, err := json.Marshal(body)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	team := keyOf(r.Context()).TeamID
	e, owner, err := s.idem.begin(team, key, sha256.Sum256(raw))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if !owner {
		select {
		case <-e.done:
		case <-r.Context().Done():
			return
		}
		if !e.ok {
			// The first create failed and was forgotten: this one runs.
			s.createOnce(w, r, body, create)
			return
		}
		writeRaw(w, http.StatusCreated, e.body)
		return
	}
	// The create goes on if this client goes away: its retry gets it.
	v, err := create()
	if err != nil {
		s.idem.finish(team, key, e, nil, false)
		httperr.Write(w, err)
		return
	}
	out, err := json.Marshal(v)
	if err != nil {
		s.idem.finish(team, key, e, nil, false)
		httperr.Write(w, err)
		return
	}
	s.idem.finish(team, key, e, out, true)
	writeRaw(w, http.StatusCreated, out)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// detach keeps a create going when its client goes away (a retry with the
// same Idempotency-Key then finds its sandbox).
func detach(ctx context.Context, r *http.Request) context.Context {
	if r.Header.Get(IdempotencyHeader) != "" {
		return context.WithoutCancel(ctx)
	}
	return ctx
}
