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

// Mode is what a call asks for.
type Mode uint8

// The modes.
const (
	Exclusive Mode = iota // Lock, TryLock: the only holder
	Shared                // RLock, TryRLock: one of any number of readers
	Units                 // Semaphore.Acquire, TryAcquire: Call.Weight of the Core's Size units
	Turn                  // Locker.Wait: a zero-length exclusive turn, holding nothing
)

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

// The states of a call. A call is queued from its start until it is
// granted (held) or ends without a grant (released); a grant is held
// until Unlock, a loss, Close, or, for a Turn, the instant it is taken.
type state uint8

const (
	queued state = iota
	held
	released
)

// Entry names one call's record in its engine: its key, the id the
// engine wrote it under (Call.Name), and its fencing token (0 if not
// known: an enqueue whose outcome is unknown).
type Entry struct {
	Key   string
	ID    string
	Token uint64
}

// Call is one Lock, TryLock, RLock, TryRLock, Wait, Acquire or TryAcquire
// of this process, from its start until its grant is released: the kit's
// record of it, which engines read and annotate. A granted call is the
// grant itself: its Lease methods (Unlock, Key, Token, Lost, Deadline,
// HandOff) are what a backend's Guard forwards to. Fields marked so are
// guarded by the Core's mutex (Core.Mu).
type Call struct {
	core  *Core
	key   string
	mode  Mode
	w     int64 // units asked for (1 outside a Semaphore)
	try   bool
	since time.Time     // when the call began
	lost  chan struct{} // closed when a held grant is lost
	sem   chan struct{} // cap 1: one Unlock at a time
	wake  chan struct{} // cap 1: there is news for the waiting call

	// Guarded by the Core's mutex.
	owner      owner.ID
	label      string   // the owner's label: owner.LabelOf of the call's ctx, or to's after a HandOff
	id         string   // the entry's id in the engine (Name)
	token      uint64   // the entry's fencing token
	session    *Session // the session whose renewals keep the entry
	data       any      // the engine's state for the call
	state      state
	grantedAt  time.Time
	ended      time.Time // when Unlock began or the grant was lost: Deadline from then on
	confirmed  bool      // the enqueue's reply arrived: the entry was written
	counted    bool      // the call counts in its session's calls
	granted    bool      // the entry holds the key (reply or notice)
	gone       bool      // the entry is gone, or its session is
	refresh    bool      // the engine asked for a re-read (Refresh)
	releasing  bool      // Unlock has begun
	lostClosed bool      // lost is closed
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
