package redislock

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/redis/go-redis/v9"
)

// Dispatch: how a waiting call learns that it holds the key.
//
// The listen loop reads the Locker's one subscription, on the prefix's
// channel. A notice lists the entries a script has just granted
// (scripts.go); the kit marks those of this Locker granted and wakes
// their calls (backend.Core.Granted). A notice "@bound {tag}" says that
// every Wait on the key of the tag with a token below bound has had its
// turn; the kit grants this Locker's (backend.Core.GrantTurns), however
// many, in one pass over its calls on the key. A notice published while the
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
			if strings.HasPrefix(m.Payload, "@") {
				if key, bound, ok := e.parseBound(m.Payload); ok {
					e.k.GrantTurns(key, bound)
				}
				continue
			}
			e.k.Granted(strings.Fields(m.Payload)...)
		}
	}
}

// parseBound reads a notice "@bound {E(P)/E(k)}" (the Waits' bound, and
// the tag of the key's names, keys.go) of this Locker's prefix P: the
// key k and the bound.
func (e *engine) parseBound(p string) (key string, bound uint64, ok bool) {
	num, tag, _ := strings.Cut(p[1:], " ")
	bound, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return "", 0, false
	}
	esc, ok := strings.CutPrefix(tag, "{"+e.esc+"/")
	if !ok || !strings.HasSuffix(esc, "}") {
		return "", 0, false
	}
	key, ok = backend.Unescape(esc[:len(esc)-1], "/{}")
	return key, bound, ok
}
