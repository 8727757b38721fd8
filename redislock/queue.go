package redislock

import (
	"context"
	"fmt"
)

// The round trips the components share on a key's queue: check (read
// it, purging the dead entries at its head) and release (remove an
// entry), one script each (scripts.go), and bounded, which waits for a
// round trip no longer than the caller's context. The enqueueing script
// is run by the call itself (acquire.go), the renewal by the session loop
// (session.go).

// check runs the check script on key's queue for member ("" for none):
// whether member is in the queue, how many entries it holds, and the
// entries that hold the key.
func (c *core) check(ctx context.Context, key, member string) (present bool, n int64, holders []string, err error) {
	names := namesOf(c.esc, key)
	v, err := checkScript.Run(ctx, c.client, []string{names.queue}, names.markers, c.channel, member).Slice()
	if err != nil {
		return false, 0, nil, err
	}
	if len(v) < 2 {
		return false, 0, nil, fmt.Errorf("redislock: unexpected reply %v from the check script", v)
	}
	p, _ := v[0].(int64)
	n, _ = v[1].(int64)
	for _, m := range v[2:] {
		if s, ok := m.(string); ok {
			holders = append(holders, s)
		}
	}
	return p == 1, n, holders, nil
}

// release runs the release script: it removes member from key's queue
// and reports whether it was there.
func (c *core) release(ctx context.Context, key, member string) (bool, error) {
	names := namesOf(c.esc, key)
	n, err := runOnce(ctx, c.client, releaseScript, releaseSrc, []string{names.queue, names.markers + c.sid},
		names.markers, c.channel, member).Int64()
	return n == 1, err
}

// bounded runs fn, which makes Redis calls with ctx, on a goroutine of
// its own and waits for it until ctx is done; it reports whether fn
// returned. go-redis applies a context's deadline to a connection's reads
// only when the client has ContextTimeoutEnabled; otherwise a server that
// hangs holds a call for the client's ReadTimeout, whatever its context.
// The goroutine counts as pending, so Close waits for it.
func (c *core) bounded(ctx context.Context, fn func()) bool {
	done := make(chan struct{})
	c.mu.Lock()
	c.pending++
	c.mu.Unlock()
	go func() {
		fn()
		close(done)
		c.mu.Lock()
		c.pending--
		c.signalIdle()
		c.mu.Unlock()
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}
