package flight

import "time"

// Waiting returns the number of calls waiting on key's run in g (0 if
// none is in flight): how the tests know a call has joined, without
// sleeping.
func Waiting[K comparable, V any](g *Group[K, V], key K) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.m[key]; c != nil {
		return c.waiting
	}
	return 0
}

// Len returns the number of runs in flight in g.
func Len[K comparable, V any](g *Group[K, V]) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}

// LoadWaiting returns the number of calls of c waiting on key's load.
func LoadWaiting[V any](c *Cache[V], key string) int { return Waiting(&c.loads, key) }

// SetClock makes c read the time from now and draw XFetch's uniform
// (0, 1] number from rand.
func SetClock[V any](c *Cache[V], now func() time.Time, rand func() float64) {
	c.now, c.rand = now, rand
}
