package backend

import "time"

// The hub: how an engine hands its notices to the calls they concern. A
// notice that grants entries by id (a Redis announcement, a PostgreSQL
// re-read) goes through Granted; an engine that judges each call's turn
// itself (etcd's watch of the keys ahead) marks it with GrantLocked. A
// notice may come before the reply of the write that queued the call: the
// call was named (Call.Name) before the write was sent, so it is found,
// and its grant waits for the reply.

// Granted marks the calls of the entries ids granted and wakes them; ids
// that are not this Locker's are ignored. It takes the Core's mutex.
func (k *Core) Granted(ids ...string) {
	k.mu.Lock()
	k.GrantedLocked(ids...)
	k.mu.Unlock()
}

// GrantedLocked is Granted with the Core's mutex held.
func (k *Core) GrantedLocked(ids ...string) {
	for _, id := range ids {
		if c := k.ids[id]; c != nil {
			k.GrantLocked(c)
		}
	}
}

// GrantLocked marks c's current entry granted and wakes its call. The
// Core's mutex must be held.
func (k *Core) GrantLocked(c *Call) {
	if !c.granted {
		c.granted = true
		c.signal()
	}
}

// GrantTurns grants every Turn (Wait) of this Locker on key whose token
// is below bound: the engine's notice that every call queued on key
// before bound has left (bound is at or below the token of the first
// call still queued, other Turns aside), so every Turn with a smaller
// token has had its turn. One notice for a key thus frees any number of
// Turns without naming them, and costs the engine that sends it nothing
// per Turn. A Turn whose enqueue's reply has not come yet (its token is
// not known) keeps the bound and compares its token with it when the
// reply comes: the notice may overtake the reply, and a notice sent
// before the Turn's enqueue ran names a bound at or below its token, so
// no order of the two grants it wrongly. The engine removes the entries
// of those Turns itself, with the change that moved the bound (the kit
// leaves nothing of them to the janitor). It takes the Core's mutex and
// costs one pass over this Locker's calls on key.
func (k *Core) GrantTurns(key string, bound uint64) {
	k.mu.Lock()
	k.GrantTurnsLocked(key, bound)
	k.mu.Unlock()
}

// GrantTurnsLocked is GrantTurns with the Core's mutex held.
//
// A Turn it grants is ended here, in the same hold of the mutex: its
// books are closed as the call's end would close them (finish), and its
// call woken to return at once,
// without taking the mutex again. Many Turns woken together would
// otherwise each take the mutex twice more on their way out, and on few
// CPUs that convoy, not the engine, would set when the last returns;
// this is the direct hand-off the in-process lock makes (fairlock's
// waiters are granted by the releaser, not by themselves).
func (k *Core) GrantTurnsLocked(key string, bound uint64) {
	cs := k.keys[key]
	kept := cs[:0]
	ended := false
	for _, c := range cs {
		if c.mode == Turn && c.state == queued {
			switch {
			case !c.confirmed:
				c.turnBound = max(c.turnBound, bound)
			case c.token < bound:
				k.endTurnLocked(c)
				ended = true
				continue
			}
		}
		kept = append(kept, c)
	}
	clear(cs[len(kept):])
	if len(kept) == 0 {
		delete(k.keys, key)
	} else {
		k.keys[key] = kept
	}
	if ended {
		k.signalIdle()
	}
}

// endTurnLocked ends c, a queued Turn whose turn has come and whose
// entry the engine removed, for its call: what wait and finish would do
// for it but taking it out of its key's list (the caller does). The
// Core's mutex must be held.
func (k *Core) endTurnLocked(c *Call) {
	k.retireLocked(c)
	c.state = released
	k.calls--
	c.turnDone.Store(true)
	c.signal()
}

// LoseLocked marks c's current entry gone: a queued call queues again, a
// held grant is lost (its Lost channel closes). The Core's mutex must be
// held.
func (k *Core) LoseLocked(c *Call) {
	if c.state != released {
		k.loseLocked(c, time.Now())
	}
}

// Lose marks the entry id gone if it is still the current entry of a
// queued call (a re-read found it missing), but a Turn's whose turn has
// come (GrantTurns): its entry's only part was to keep its place until
// then. It takes the Core's mutex.
func (k *Core) Lose(id string) {
	k.mu.Lock()
	if c := k.ids[id]; c != nil && c.state == queued && !(c.mode == Turn && c.granted) {
		k.loseLocked(c, time.Now())
	}
	k.mu.Unlock()
}

// RefreshLocked asks the kit to have c's queue read again (Engine.Refresh)
// and wakes c's call. The Core's mutex must be held.
func (k *Core) RefreshLocked(c *Call) {
	c.refresh = true
	c.signal()
}

// CallLocked returns the call whose current entry is id, or nil. The
// Core's mutex must be held.
func (k *Core) CallLocked(id string) *Call { return k.ids[id] }

// WrittenLocked calls fn, with the Core's mutex held, for every call of this
// Locker whose entry may be in the engine (queued or held, confirmed or
// not), until fn returns false.
func (k *Core) WrittenLocked(fn func(c *Call) bool) {
	for _, c := range k.ids {
		if !fn(c) {
			return
		}
	}
}

// EndTurnLocked ends c, a Turn (Wait) whose entry is confirmed and still
// queued, because the engine judged that its turn has come: in the same
// hold of the mutex, as GrantTurnsLocked ends the Turns below a bound, so
// that many Turns freed by one notice return without each taking the
// mutex twice more. Its entry goes to the janitor, which removes it
// after turnRemovalDelay with the other finished Turns' of its key, in
// one sweep (BatchRemover). It
// reports false, changing nothing, for any other call: the engine then
// grants it with GrantLocked. The Core's mutex must be held.
func (k *Core) EndTurnLocked(c *Call) bool {
	if c.mode != Turn || c.state != queued || !c.confirmed || c.gone || c.turnDone.Load() {
		return false
	}
	e := c.entry()
	k.forgetLocked(c)
	k.endTurnLocked(c)
	k.cleanupTurnLocked(e)
	k.signalIdle()
	return true
}
