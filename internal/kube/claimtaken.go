package kube

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// taken remembers the Sandbox each claim took in this process, and whether
// the claim's status naming it was written, until the cache shows that
// status: a reconcile from a cache that lags neither adopts a second member
// nor reads the claim from the API server to learn it has one. A new leader
// starts empty and reads the API server, as its cache may lag the last
// leader's writes.
type taken struct {
	mu     sync.Mutex
	claims map[types.UID]takenBy
	// members are the pool members this process adopted or is adopting,
	// by namespace/name, while the cache may still list them as ready:
	// claims reconciled at once, or from a cache that lags, skip them
	// instead of each spending an update on a conflict.
	members map[string]reserved
}

// reserved is a member reserved at the resourceVersion the cache showed.
type reserved struct {
	version string
	at      time.Time
}

// reserve marks a pool member, as the cache shows it at version, as being
// adopted; false when a claim here has reserved that version. A newer
// version in the cache (still a pool member, so not adopted) is free again.
func (t *taken) reserve(member, version string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if r, ok := t.members[member]; ok && r.version == version && now.Sub(r.at) <= expectWindow {
		return false
	}
	if t.members == nil {
		t.members = map[string]reserved{}
	}
	t.members[member] = reserved{version, now}
	if len(t.members) > 4096 {
		for k, r := range t.members {
			if now.Sub(r.at) > expectWindow {
				delete(t.members, k)
			}
		}
	}
	return true
}

// unreserve gives back a member whose adoption failed for a reason other
// than another claim having it.
func (t *taken) unreserve(member string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.members, member)
}

type takenBy struct {
	sandbox string
	written bool
	at      time.Time
}

// put records that claim took sandbox (its status not written yet).
func (t *taken) put(claim types.UID, sandbox string) {
	t.set(claim, func(b *takenBy) { b.sandbox, b.written = sandbox, false })
}

// wrote records that claim's status names sandbox on the API server.
func (t *taken) wrote(claim types.UID, sandbox string) {
	t.set(claim, func(b *takenBy) { b.sandbox, b.written = sandbox, true })
}

func (t *taken) set(claim types.UID, edit func(*takenBy)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claims == nil {
		t.claims = map[types.UID]takenBy{}
	}
	b := t.claims[claim]
	edit(&b)
	b.at = time.Now()
	t.claims[claim] = b
	if len(t.claims) > 4096 {
		// Records of claims never reconciled again.
		for k, v := range t.claims {
			if b.at.Sub(v.at) > expectWindow {
				delete(t.claims, k)
			}
		}
	}
}

// get is the sandbox claim took here and whether its status was written;
// "" when none is recorded or the record is older than expectWindow (the
// cache has caught up by then, or something else changed the claim: the
// API server says).
func (t *taken) get(claim types.UID) (sandbox string, written bool) {
	b := t.record(claim)
	return b.sandbox, b.written
}

func (t *taken) record(claim types.UID) takenBy {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.claims[claim]
	if !ok {
		return takenBy{}
	}
	if time.Since(b.at) > expectWindow {
		delete(t.claims, claim)
		return takenBy{}
	}
	return b
}

// forget drops the record once the cache shows it, or the claim is gone.
func (t *taken) forget(claim types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.claims, claim)
}
