package redislock

import (
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dispatch: how a waiting call learns that it holds the key.
//
// The listen loop reads the Locker's one subscription, on the prefix's
// channel. Each notice lists the entries a script has just granted
// (scripts.go); the loop marks those of this Locker granted and wakes
// their calls. A notice published while the subscription is down is lost,
// so when go-redis resubscribes (it reconnects on its own and the server
// confirms the subscription again), the renewal loop re-reads the queue
// of every key with a waiting call. A notice that arrives before the
// enqueue's own reply finds the call already registered (its entry is
// named before the script is sent), so no order of the two loses it.

// listen dispatches notices until the subscription is closed. It runs in
// its own goroutine.
func (c *core) listen() {
	defer c.wg.Done()
	first := true
	// Attempts back off from 50 ms to 1 s while Redis is unreachable, and
	// an outage is logged once, at its first failure.
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := time.Duration(0)
	for {
		msg, err := c.pubsub.Receive(c.bg)
		if err != nil {
			if c.bg.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			if backoff == 0 {
				c.logger.Warn("redislock: subscription failed; resubscribing", "locker", c.name, "channel", c.channel, "error", err)
				backoff = minBackoff
			} else {
				backoff = min(2*backoff, maxBackoff)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-c.bg.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			if first {
				first = false
				close(c.ready)
				continue
			}
			select {
			case c.reread <- struct{}{}:
			default:
			}
		case *redis.Message:
			c.mu.Lock()
			c.grantLocked(strings.Fields(m.Payload))
			c.mu.Unlock()
		}
	}
}

// grantLocked marks the calls of the given entries granted. c.mu is held.
func (c *core) grantLocked(members []string) {
	for _, m := range members {
		if g := c.entries[m]; g != nil && !g.granted {
			g.granted = true
			g.signal()
		}
	}
}
