package redislock

import (
	"context"
	"time"
)

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
// The renewal also removes the session's entries that hold the key but
// that no call of the Locker knows any more (a restore or a failover
// brought them back: stale.go).
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
		cutoff  uint64 // stale.go
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
			td.cutoff = c.staleCutoffLocked(ks)
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
		n := namesOf(c.esc, td.key)
		sent := time.Now()
		v, err := renewScript.Run(ctx, c.client, []string{n.queue, n.markers + c.sid},
			c.renewArgs(n, td.cutoff, td.members)...).Slice()
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
