package backend

import (
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
)

// The waiter record: what a process knows of one of its calls, from the
// call's start until its grant is released. Calls are made by the kit
// (Core.Acquire); engines read them and keep their own state beside them
// (SetData).

// String returns the debug registry's name of the mode.
func (m Mode) String() string {
	switch m {
	case Shared:
		return registry.Shared
	case Units:
		return registry.Units
	case Turn:
		return registry.Wait
	}
	return registry.Exclusive
}

// Key returns the key the call is for.
func (c *Call) Key() string {
	if c == nil {
		return ""
	}
	return c.key
}

// Mode returns what the call asks for.
func (c *Call) Mode() Mode { return c.mode }

// Weight returns the units the call asks for: 1 outside a Semaphore.
func (c *Call) Weight() int64 { return c.w }

// Try reports whether the call is a Try form: granted at once or not at
// all, never queued.
func (c *Call) Try() bool { return c.try }

// Since returns when the call began.
func (c *Call) Since() time.Time { return c.since }

// Owner returns the owner the call is for (it changes with HandOff).
// The Core's mutex must be held, or the call not yet granted.
func (c *Call) Owner() owner.ID { return c.owner }

// Label returns the label of the call's owner, read from the call's
// context when it began (owner.LabelOf), or, after a HandOff, the new
// owner's (owner.ID.Label, read then); "" for an owner without one. An
// engine records it with the call's entry so that a listing in another
// process shows it (Lister). The Core's mutex must be held, or the call
// not yet granted.
func (c *Call) Label() string { return c.label }

// ID returns the id the call's current entry was named with (Name); ""
// before. The Core's mutex must be held, or the call granted.
func (c *Call) ID() string { return c.id }

// Data returns what the engine stored with SetData. The Core's mutex
// must be held.
func (c *Call) Data() any { return c.data }

// SetData stores the engine's state for the call. The Core's mutex must
// be held.
func (c *Call) SetData(v any) { c.data = v }

// Session returns the session of the call's entry; nil before its
// enqueue's reply. The Core's mutex must be held, or the call granted.
func (c *Call) Session() *Session { return c.session }

// Name records that the call's next entry is written under id, before
// the engine sends the write: a notice that grants id (Core.Granted) may
// then arrive before the write's own reply and still find the call, and
// if the write's outcome stays unknown the kit removes id when it shows
// up. Enqueue calls it once per attempt; it takes the Core's mutex.
func (c *Call) Name(id string) {
	c.core.mu.Lock()
	c.NameLocked(id)
	c.core.mu.Unlock()
}

// NameLocked is Name with the Core's mutex held: for an engine that must
// number an entry and name it in one hold of the mutex.
func (c *Call) NameLocked(id string) {
	k := c.core
	if c.id != "" && k.ids[c.id] == c {
		delete(k.ids, c.id)
	}
	c.id = id
	c.confirmed, c.granted, c.gone, c.refresh = false, false, false, false
	k.ids[id] = c
}

// entry returns c's current entry. The Core's mutex must be held, or the
// call granted.
func (c *Call) entry() Entry { return Entry{Key: c.key, ID: c.id, Token: c.token} }

// signal wakes the goroutine waiting in c. The Core's mutex is held.
func (c *Call) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// closeLost closes c's Lost channel, once, and marks when the grant
// ended. The Core's mutex is held.
func (c *Call) closeLost(now time.Time) {
	if !c.lostClosed {
		c.lostClosed = true
		close(c.lost)
		if c.ended.IsZero() {
			c.ended = now
		}
	}
}

// Queued reports whether c is still waiting for its grant: not granted,
// not gone, not released. The Core's mutex must be held.
func (c *Call) Queued() bool { return c.state == queued && !c.granted && !c.gone }

// Confirmed reports whether c's entry was written (its enqueue's reply
// arrived), is not known to be gone, and is not yet released: an entry
// the engine renews. The Core's mutex must be held.
func (c *Call) Confirmed() bool { return c.confirmed && !c.gone && c.state != released }

// Releasing reports whether c's Unlock has begun: its entry may be gone
// any moment, because it was released, and a renewal that finds it
// missing does not count it lost. The Core's mutex must be held.
func (c *Call) Releasing() bool { return c.releasing }

// InFlight reports whether c's entry is named and its write not yet
// answered: it may be in the engine, or land later. The Core's mutex must
// be held.
func (c *Call) InFlight() bool { return !c.confirmed && c.state == queued && c.id != "" }

// Held reports whether c is a grant not yet released. The Core's mutex
// must be held.
func (c *Call) Held() bool { return c.state == held }
