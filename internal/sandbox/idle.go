package sandbox

import (
	"context"
	"sync"
	"time"
)

// idleState is what the idle policy knows of each sandbox's data plane
// (last traffic, requests in flight, frozen) and the life that traffic is
// tied to, under a lock of its own. Lock order: Manager.mu, then this
// one; it never takes the manager's.
type idleState struct {
	mu       sync.Mutex
	activity map[string]*activity
	// gone is cancelled when the sandbox is removed, ending the data-plane
	// traffic still in flight to it (Wake); a pause keeps it.
	gone map[string]sandboxLife
}

// activity is what the idle policy knows of a sandbox's data plane.
type activity struct {
	last     time.Time
	inflight int
	frozen   bool
}

// sandboxLife is a context that lives as long as one sandbox.
type sandboxLife struct {
	ctx context.Context
	end context.CancelFunc
}

func newIdleState() *idleState {
	return &idleState{activity: map[string]*activity{}, gone: map[string]sandboxLife{}}
}

// get returns id's activity, made (last = now) on first use (t.mu held).
func (t *idleState) get(id string, now time.Time) *activity {
	a := t.activity[id]
	if a == nil {
		a = &activity{last: now}
		t.activity[id] = a
	}
	return a
}

// touch records data-plane activity now.
func (t *idleState) touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.get(id, time.Time{}).last = time.Now()
}

// request counts one request in flight to id; done ends it.
func (t *idleState) request(id string) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id, time.Now())
	a.inflight++
	return func() {
		t.mu.Lock()
		a.inflight--
		a.last = time.Now()
		t.mu.Unlock()
	}
}

// idle returns how long id has had no traffic and whether requests are in
// flight.
func (t *idleState) idle(id string, now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id, now)
	return now.Sub(a.last), a.inflight > 0
}

// freezeIfIdle marks id frozen when it is not yet, has no request in
// flight and had no traffic for longer than after; it reports whether it
// did (the caller then freezes it).
func (t *idleState) freezeIfIdle(id string, now time.Time, after time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id, now)
	if a.frozen || a.inflight > 0 || now.Sub(a.last) <= after {
		return false
	}
	a.frozen = true
	return true
}

// frozen reports whether the idle policy froze id.
func (t *idleState) frozen(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.activity[id]
	return a != nil && a.frozen
}

// thawed records that id is no longer frozen.
func (t *idleState) thawed(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.activity[id]; a != nil {
		a.frozen = false
	}
}

// life returns the context of id's life, made on first use.
func (t *idleState) life(id string) sandboxLife {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.gone[id]
	if !ok {
		l.ctx, l.end = context.WithCancel(context.Background())
		t.gone[id] = l
	}
	return l
}

// forget drops id's activity (it stopped running; a pause keeps its life).
func (t *idleState) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.activity, id)
}

// ended ends the traffic in flight to a removed sandbox and forgets it.
func (t *idleState) ended(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.gone[id]; ok {
		l.end()
		delete(t.gone, id)
	}
	delete(t.activity, id)
}
