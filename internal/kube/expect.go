package kube

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// expectWindow bounds how long a create waits to appear in the cache before
// it counts no more (a member deleted before the cache saw it never shows).
const expectWindow = time.Minute

// creations remembers the members each pool created that its cache has not
// shown yet, so a reconcile reading the cache does not create them again
// (the pattern of the ReplicaSet controller's expectations).
type creations struct {
	mu     sync.Mutex
	byPool map[types.UID]map[string]time.Time
}

// add records that pool created the member name.
func (c *creations) add(pool types.UID, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPool == nil {
		c.byPool = map[types.UID]map[string]time.Time{}
	}
	if c.byPool[pool] == nil {
		c.byPool[pool] = map[string]time.Time{}
	}
	c.byPool[pool][name] = time.Now()
}

// pending forgets the creates the cache now shows (seen) or that are older
// than expectWindow, and counts the others.
func (c *creations) pending(pool types.UID, seen func(name string) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byPool[pool]
	for name, at := range m {
		if seen(name) || time.Since(at) > expectWindow {
			delete(m, name)
		}
	}
	if len(m) == 0 {
		delete(c.byPool, pool)
	}
	return len(m)
}

// forget drops everything recorded for pool.
func (c *creations) forget(pool types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byPool, pool)
}
