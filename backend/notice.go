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

// LoseLocked marks c's current entry gone: a queued call queues again, a
// held grant is lost (its Lost channel closes). The Core's mutex must be
// held.
func (k *Core) LoseLocked(c *Call) {
	if c.state != released {
		k.loseLocked(c, time.Now())
	}
}

// Lose marks the entry id gone if it is still the current entry of a
// queued call (a re-read found it missing). It takes the Core's mutex.
func (k *Core) Lose(id string) {
	k.mu.Lock()
	if c := k.ids[id]; c != nil && c.state == queued {
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
