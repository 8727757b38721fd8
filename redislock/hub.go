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
// (scripts.go); the kit marks those of this Locker granted and wakes
// their calls (backend.Core.Granted). A notice published while the
// subscription is down is lost, so when go-redis resubscribes (it
// reconnects on its own and the server confirms the subscription again),
// the kit re-reads the queue of every key with a waiting call
// (backend.Core.Reread, then Check). A notice that arrives before the
// enqueue's own reply finds the call already named (its entry is named
// before the script is sent), so no order of the two loses it.

// listen dispatches notices until the background context ends. It runs
// in its own goroutine.
func (e *engine) listen() {
	bg := e.k.Background()
	// Attempts back off from 50 ms to 1 s while Redis is unreachable, and
	// an outage is logged once, at its first failure.
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := time.Duration(0)
	for {
		msg, err := e.pubsub.Receive(bg)
		if err != nil {
			if bg.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			if backoff == 0 {
				e.k.Logger().Warn("redislock: subscription failed; resubscribing", "locker", e.k.Name(), "channel", e.channel, "error", err)
				backoff = minBackoff
			} else {
				backoff = min(2*backoff, maxBackoff)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-bg.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			// New read the first confirmation: this one follows a
			// reconnection, after which notices may have been lost.
			if m.Kind == "subscribe" {
				e.k.Reread()
			}
		case *redis.Message:
			e.k.Granted(strings.Fields(m.Payload)...)
		}
	}
}
