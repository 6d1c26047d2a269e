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
}

type takenBy struct {
	sandbox string
	written bool
	at      time.Time
}

// put records that claim took sandbox (its status not written yet).
func (t *taken) put(claim types.UID, sandbox string) { t.set(claim, takenBy{sandbox: sandbox}) }

// wrote records that claim's status names sandbox on the API server.
func (t *taken) wrote(claim types.UID, sandbox string) {
	t.set(claim, takenBy{sandbox: sandbox, written: true})
}

func (t *taken) set(claim types.UID, b takenBy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claims == nil {
		t.claims = map[types.UID]takenBy{}
	}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.claims[claim]
	if !ok {
		return "", false
	}
	if time.Since(b.at) > expectWindow {
		delete(t.claims, claim)
		return "", false
	}
	return b.sandbox, b.written
}

// forget drops the record once the cache shows it, or the claim is gone.
func (t *taken) forget(claim types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.claims, claim)
}
