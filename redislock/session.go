package redislock

import (
	"context"
	"errors"
	"fmt"
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

// Sessions. A Locker's session on a key is the marker {…}s:<sid> (keys.go),
// set with the TTL by each enqueue and renewed with PEXPIRE every third of
// the TTL while the Locker has calls on the key; Redis's clock alone
// decides when it expires. The renewal reports the entries that are gone
// (removed by someone else, or purged after the session expired): their
// grants are lost and their queued calls queue again. The Locker keeps,
// per key, the deadline before which the server cannot have expired the
// marker: the send time of the last enqueue or renewal that set it, plus
// the TTL less a tenth (the server counts from when it ran the command,
// after the send; the tenth allows for clock rates that differ by up to
// 10%). Past the deadline without a renewal, the grants on the key are
// lost, as etcdlock loses a lease's.
//
// The same loop re-reads, every third of the TTL, the queue of every key
// on which this Locker has a waiting call (the check script, which also
// purges the dead entries at its head): this is how a waiter learns that
// a holder died, and what covers a lost notice.

// renewLoop renews sessions and re-reads queues until c.bg ends. It runs
// in its own goroutine, and each round (renewAll and checkAll) in another,
// one round at a time: go-redis applies a context's deadline to a
// connection's reads only with ContextTimeoutEnabled, so a round on a
// server that hangs can block for the client's ReadTimeout (3 s by
// default, any length if the user set it), and the loop must still lose
// the grants of a key whose renewal deadline passes meanwhile.
func (c *core) renewLoop() {
	defer c.wg.Done()
	period := c.ttl / 3
	next := time.Now().Add(period)
	t := time.NewTimer(period)
	defer t.Stop()
	var round chan bool // non-nil while a round runs; it sends whether every renewal succeeded
	reread := false     // a re-read is due once the running round ends
	for {
		wait := time.Until(next)
		c.mu.Lock()
		for _, ks := range c.keys {
			if !ks.deadline.IsZero() && ks.hasConfirmed() {
				wait = min(wait, time.Until(ks.deadline))
			}
		}
		c.mu.Unlock()
		t.Reset(max(wait, 0))
		select {
		case <-t.C:
		case <-c.reread:
			reread = true
		case ok := <-round:
			round = nil
			if !ok {
				next = time.Now().Add(c.ttl / 10)
			}
		case <-c.bg.Done():
			if round != nil {
				<-round
			}
			return
		}
		now := time.Now()
		c.expire(now)
		if round != nil {
			continue
		}
		renew := !now.Before(next)
		if !renew && !reread {
			continue
		}
		if renew {
			next = now.Add(period)
		}
		reread = false
		round = make(chan bool, 1)
		go func() {
			ok := true
			if renew {
				ok = c.renewAll()
			}
			c.checkAll()
			round <- ok
		}()
	}
}

// hasConfirmed reports whether the key has a call whose entry was
// written and not yet released. core.mu is held.
func (ks *keyState) hasConfirmed() bool {
	for _, g := range ks.guards {
		if g.confirmed && g.state != released {
			return true
		}
	}
	return false
}

// expire loses the calls on every key whose renewal deadline has passed.
// It logs after c.mu is released: the logger is the user's code.
func (c *core) expire(now time.Time) {
	type loss struct {
		key   string
		calls int
	}
	var losses []loss
	c.mu.Lock()
	for key, ks := range c.keys {
		if ks.deadline.IsZero() || now.Before(ks.deadline) {
			continue
		}
		lost := 0
		for _, g := range ks.guards {
			if g.confirmed && g.state != released && !g.gone {
				c.loseLocked(g)
				lost++
			}
		}
		if lost > 0 {
			losses = append(losses, loss{key, lost})
		}
		ks.deadline = time.Time{}
	}
	c.mu.Unlock()
	for _, l := range losses {
		c.logger.Warn("redislock: session not renewed for its TTL; its calls on the key are lost",
			"locker", c.name, "key", l.key, "calls", l.calls)
	}
}

// renewAll renews the session on every key with a written entry. It
// reports whether every renewal succeeded.
func (c *core) renewAll() bool {
	type todo struct {
		key     string
		members []string
		guards  []*Guard
	}
	var list []todo
	c.mu.Lock()
	for key, ks := range c.keys {
		var td todo
		for _, g := range ks.guards {
			if g.confirmed && g.state != released && !g.gone {
				td.members = append(td.members, g.member)
				td.guards = append(td.guards, g)
			}
		}
		if len(td.guards) > 0 {
			td.key = key
			list = append(list, td)
		}
	}
	c.mu.Unlock()
	ok := true
	// One bound for the round, so that an unreachable server delays the
	// next round (and expire's deadlines) by at most a third of the TTL,
	// however many keys there are.
	ctx, cancel := context.WithTimeout(c.bg, c.ttl/3)
	defer cancel()
	for _, td := range list {
		n := c.namesOf(td.key)
		sent := time.Now()
		v, err := renewScript.Run(ctx, c.client, []string{n.markers + c.sid, n.queue},
			append([]any{c.ttlMs}, anys(td.members)...)...).Slice()
		if err != nil {
			if c.bg.Err() == nil {
				c.logger.Warn("redislock: session renewal failed; retrying", "locker", c.name, "key", td.key, "error", err)
			}
			ok = false
			continue
		}
		c.mu.Lock()
		// A call that queued again since the snapshot has a new entry,
		// which the reply does not concern; one released since then lost
		// nothing (its release may have deleted the marker).
		status, _ := v[0].(int64)
		lost := 0
		if status == -1 {
			for i, g := range td.guards {
				if g.member == td.members[i] && g.state != released {
					c.loseLocked(g)
					lost++
				}
			}
		} else {
			missing := make(map[string]bool, len(v)-1)
			for _, m := range v[1:] {
				if s, ok := m.(string); ok {
					missing[s] = true
				}
			}
			for i, g := range td.guards {
				if missing[td.members[i]] && g.member == td.members[i] {
					c.loseLocked(g)
				}
			}
			if ks := c.keys[td.key]; ks != nil {
				if d := sent.Add(c.ttl - c.ttl/10); d.After(ks.deadline) {
					ks.deadline = d
				}
			}
		}
		c.mu.Unlock()
		if lost > 0 { // logged without c.mu: the logger is the user's code
			c.logger.Warn("redislock: session expired on the server; its calls on the key are lost",
				"locker", c.name, "key", td.key, "calls", lost)
		}
	}
	return ok
}

// checkAll re-reads the queue of every key on which this Locker has a
// waiting call, through its first waiting call: the check script purges
// the dead entries at the head of the queue, announces what that grants,
// and returns the entries that hold the key, which are dispatched here
// too (a notice may have been lost).
func (c *core) checkAll() {
	type todo struct {
		key string
		g   *Guard
	}
	var list []todo
	c.mu.Lock()
	for key, ks := range c.keys {
		for _, g := range ks.guards {
			if g.confirmed && g.state == queued && !g.granted && !g.gone {
				list = append(list, todo{key, g})
				break
			}
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.bg, c.ttl/3) // one bound for the round, as in renewAll
	defer cancel()
	for _, td := range list {
		c.mu.Lock()
		member := td.g.member
		c.mu.Unlock()
		present, _, holders, err := c.check(ctx, td.key, member)
		if err != nil {
			if c.bg.Err() == nil {
				c.logger.Warn("redislock: reading a queue failed; retrying", "locker", c.name, "key", td.key, "error", err)
			}
			continue
		}
		c.mu.Lock()
		c.grantLocked(holders)
		if !present && td.g.member == member && td.g.state == queued {
			c.loseLocked(td.g)
		}
		c.mu.Unlock()
	}
}

// check runs the check script on key's queue for member ("" for none):
// whether member is in the queue, how many entries it holds, and the
// entries that hold the key.
func (c *core) check(ctx context.Context, key, member string) (present bool, n int64, holders []string, err error) {
	names := c.namesOf(key)
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
	names := c.namesOf(key)
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

// remove removes a call's entry now, on the Locker's background context
// bounded by cleanupTimeout, not the call's (a cancelled call's context
// must not stop its cleanup), and hands it to the janitor if that fails
// or does not finish within the bound.
func (c *core) remove(key, member string) {
	ctx, cancel := context.WithTimeout(c.bg, cleanupTimeout)
	var err, rerr error // rerr: written by the goroutine, read only once it returned
	if c.bounded(ctx, func() { _, rerr = c.release(ctx, key, member) }) {
		err = rerr
	} else {
		err = ctx.Err()
	}
	cancel()
	if err != nil {
		if c.bg.Err() == nil {
			c.logger.Warn("redislock: could not remove an entry; retrying in the background",
				"locker", c.name, "key", key, "error", err)
		}
		c.janitorAdd(key, member, false)
	}
}

// The janitor. An entry that must go but could not be removed at once
// (Redis unreachable, or an enqueue whose outcome is unknown) is recorded
// and its removal retried every second until it succeeds, or, for an
// enqueue whose outcome is unknown, until a grace period passes after
// which that script can no longer run. Close makes a last attempt. An
// entry the janitor has not removed yet dies with the session's marker on
// its key once nothing else of this Locker renews it.

// cleanup is an entry the janitor removes.
type cleanup struct {
	key   string
	until time.Time // keep removing until then (a script that may still run); zero: once
}

// unknownGrace is how long after an enqueue with an unknown outcome the
// janitor keeps removing its entry, in case the script runs late.
const unknownGrace = time.Minute

// janitorAdd records that member must be removed from key's queue.
func (c *core) janitorAdd(key, member string, unknown bool) {
	cl := cleanup{key: key}
	if unknown {
		cl.until = time.Now().Add(unknownGrace)
	}
	c.mu.Lock()
	c.janitor[member] = cl
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// janitorLoop retries recorded removals every second while there are
// some, until c.bg ends. It runs in its own goroutine.
func (c *core) janitorLoop() {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.kick:
		case <-t.C:
		case <-c.bg.Done():
			return
		}
		c.sweep(c.bg)
	}
}

// sweep tries every recorded removal once, until ctx ends, and returns
// the last error.
func (c *core) sweep(ctx context.Context) error {
	c.mu.Lock()
	todo := make(map[string]cleanup, len(c.janitor))
	for m, cl := range c.janitor {
		todo[m] = cl
	}
	c.mu.Unlock()
	var last error
	for member, cl := range todo {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		_, err := c.release(rctx, cl.key, member)
		cancel()
		if err != nil {
			last = err
			continue
		}
		if cl.until.IsZero() || time.Now().After(cl.until) {
			c.mu.Lock()
			if c.janitor[member] == cl {
				delete(c.janitor, member)
			}
			c.mu.Unlock()
		}
	}
	return last
}

// anys converts strings to script arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
