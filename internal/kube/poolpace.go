package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// poolStatusEvery is the least time between two status writes of a pool:
// during a burst every adoption, create and member turning ready changes
// the counts, and a write for each cost the API server about one request
// per claim; the last counts are written at most this late.
const poolStatusEvery = time.Second

// refillRetry is how soon a pool that put off its refill looks again.
const refillRetry = 250 * time.Millisecond

// statusPace remembers when each pool's status was last written.
type statusPace struct {
	mu   sync.Mutex
	last map[types.UID]time.Time
}

// wait is how long pool's status write must wait (0: write now, and it is
// recorded as written).
func (p *statusPace) wait(pool types.UID, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if left := poolStatusEvery - now.Sub(p.last[pool]); left > 0 {
		return left
	}
	if p.last == nil {
		p.last = map[types.UID]time.Time{}
	}
	p.last[pool] = now
	if len(p.last) > 4096 {
		for k, at := range p.last {
			if now.Sub(at) > poolStatusEvery {
				delete(p.last, k)
			}
		}
	}
	return 0
}

// forget drops a deleted pool.
func (p *statusPace) forget(pool types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.last, pool)
}

// waitingClaims counts the pool's claims this controller has not answered
// yet (no status at all): claims go first, and a pool refills after them.
func (b reconcilerBase) waitingClaims(ctx context.Context, pool *extv1.SandboxWarmPool) (int, error) {
	var list extv1.SandboxClaimList
	if err := b.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("list claims: %w", err)
	}
	n := 0
	for i := range list.Items {
		c := &list.Items[i]
		if c.Spec.WarmPoolRef.Name == pool.Name && c.DeletionTimestamp.IsZero() &&
			c.Status.SandboxStatus.Name == "" && len(c.Status.Conditions) == 0 {
			n++
		}
	}
	return n, nil
}

// refillLater says whether a pool with ready members and want replicas
// puts off creating members while waiting claims are unanswered: each
// create, binding and status is a request a claim would queue behind at
// the API server. It refills at once when its ready members, less those
// the waiting claims will take, fall to a tenth of want: a claim that
// finds the pool empty cold-starts.
func refillLater(ready, want int32, waiting int) bool {
	if waiting == 0 {
		return false
	}
	low := max(want/10, 1)
	return ready-int32(waiting) > low
}
