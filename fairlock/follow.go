package fairlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
)

// Following a key: a Feed hears every change of a key's holders, in the
// order the shard mutex made them, from the transitions themselves
// rather than by reading the key again and again (what a poll of Calls
// would do, and miss a grant that comes and goes between two reads).
//
// A shard with a followed key keeps a record of it (shard.follows) and
// stays in slow mode while the record exists (shard.unlock): every grant
// and release of its keys then goes through the mutex, where the
// transitions that can change a key's holders (an admit in acquireSlow,
// and settle, which books every release, cancel and close) hand the key's
// entry to followed. That check, one load of a nil map under a mutex the
// slow path already holds, is all a key nobody follows pays; the
// lock-free fast path pays nothing. followed compares the holders' tokens
// with those it last reported for the key and, only if they differ,
// appends one KeyChange to each Feed's buffer, under the Feed's own
// mutex (taken under the shard mutex, never the other way round). A
// reader takes the changes from the buffer with Next, outside the shard
// mutex; a buffer that fills (a reader that stopped reading) is dropped
// whole, and its next Next reads the key afresh and says so (Gap). The
// idea is etcd's watch with its compaction error, kept in one process:
// every change in order while the history is kept, an explicit gap when
// it is not.

// feedBuffer is how many changes a Feed keeps for a reader that does not
// take them; one more drops them all and marks a gap (Feed.Next).
const feedBuffer = 4096

// KeyChange is one change of a key's holders, as Feed.Next reports it.
type KeyChange struct {
	// Holders are the key's holders right after the change, in grant
	// order, as Locker.Calls reports holders (Held is true, Token is
	// the grant's; a Label the call did not record is its owner's at
	// the change, owner.ID.Label). Empty: nobody holds the key.
	Holders []KeyCall
	// At is when the change was made, on this process's clock (read
	// under the shard mutex, for followed keys only).
	At time.Time
	// Gap says that changes between the one Next returned before and
	// this one were dropped: the reader had left more than the buffer's
	// worth untaken. Holders are then the key's holders when Next read
	// them afresh, and At that instant.
	Gap bool
}

// Feed is one reader's record of a key's changes (Locker.Follow,
// Semaphore.Follow). Its methods are safe for concurrent use, though a
// Feed is meant for one reader: each change is returned once.
type Feed[K comparable] struct {
	t     *table[K]
	key   K
	ready chan struct{} // capacity 1: a change is buffered, or Stop was called

	mu      sync.Mutex  // guards the fields below; taken under the shard mutex, never the reverse
	pending []KeyChange // changes not yet returned, oldest first, from head
	head    int         // index of the oldest change not yet returned
	gap     bool        // the buffer overflowed: the next Next reads the key afresh
	stopped bool        // Stop was called
}

// keyFollows is a shard's record of one followed key: its Feeds, and the
// tokens of its holders at the last change reported to them.
type keyFollows[K comparable] struct {
	feeds  []*Feed[K]
	tokens []uint64
}

// Follow returns a Feed of key's changes: the key's holders now first,
// then one KeyChange each time a grant or a release changes them (a
// Lock, RLock or Acquire granted, an Unlock, a hand-over to a waiter),
// in the order they were made, none left out while the reader keeps up.
// Queueing, cancelling a wait and HandOff change no holder and are not
// reported. It is the in-process side of keylock.Follower; etcd's
// concurrency.Election.Observe and client-go's leaderelection watch a
// leader's record the same way on their engines.
//
// While a Feed of a key is open, the key's shard takes the mutex for
// every grant (no lock-free fast path there), each change of the key's
// holders allocates its KeyChange, and the Feed buffers up to 4096
// changes for a reader that does not take them; past that it drops them
// and reports a gap. Call Stop when done: an open Feed keeps its record
// in the shard. Follow takes key's shard mutex once; it returns a
// *LockError wrapping ErrInvalidKey for a key not equal to itself (a
// NaN), and otherwise never fails, also after Close.
func (l *Locker[K]) Follow(key K) (*Feed[K], error) { return l.t.follow(key) }

// Follow returns a Feed of key's changes, as Locker.Follow does, each
// holder with its units.
func (s *Semaphore[K]) Follow(key K) (*Feed[K], error) { return s.t.follow(key) }

// follow implements Follow for both faces.
func (t *table[K]) follow(key K) (*Feed[K], error) {
	if key != key {
		return nil, &LockError{Op: "Follow", Key: key, Err: ErrInvalidKey, render: t.renderAny}
	}
	f := &Feed[K]{t: t, key: key, ready: make(chan struct{}, 1)}
	s, tag := t.shardOf(key)
	s.lock() // inflates a fast grant of the key: it is among the holders below
	e := s.find(key, tag)
	if s.follows == nil {
		s.follows = make(map[K]*keyFollows[K])
	}
	kf := s.follows[key]
	if kf == nil {
		kf = &keyFollows[K]{tokens: holderTokens(e, nil)}
		s.follows[key] = kf
	}
	kf.feeds = append(kf.feeds, f)
	f.pending = append(f.pending, KeyChange{Holders: t.holdersOf(e), At: time.Now()})
	s.unlock() // stays in slow mode: s.follows is not nil
	f.ready <- struct{}{}
	return f, nil
}

// Next returns the oldest change not yet returned, blocking until there
// is one or ctx ends. The first is the key's holders when Follow was
// called. It returns the context's error (context.Cause's where it has
// one) if ctx ends first, and ErrClosed once Stop was called. A change
// whose Gap is set follows a buffer overflow: Next read the key afresh,
// taking its shard mutex once. It allocates nothing itself.
func (f *Feed[K]) Next(ctx context.Context) (KeyChange, error) {
	for {
		f.mu.Lock()
		switch {
		case f.stopped:
			f.mu.Unlock()
			return KeyChange{}, ErrClosed
		case f.gap:
			f.mu.Unlock()
			return f.resync(), nil
		case f.head < len(f.pending):
			c := f.pending[f.head]
			f.pending[f.head] = KeyChange{}
			f.head++
			if f.head == len(f.pending) {
				f.pending, f.head = f.pending[:0], 0
			}
			f.mu.Unlock()
			return c, nil
		}
		f.mu.Unlock()
		select {
		case <-f.ready:
		case <-ctx.Done():
			return KeyChange{}, ctxerr.Of(ctx)
		}
	}
}

// resync reads the key's holders afresh after a buffer overflow and
// clears the gap, under the shard mutex so that no change slips between
// the read and the buffer's restart.
func (f *Feed[K]) resync() KeyChange {
	t := f.t
	s, tag := t.shardOf(f.key)
	s.lock()
	c := KeyChange{Holders: t.holdersOf(s.find(f.key, tag)), At: time.Now(), Gap: true}
	f.mu.Lock()
	f.gap, f.pending, f.head = false, nil, 0
	f.mu.Unlock()
	s.unlock()
	return c
}

// Stop ends the Feed: a Next blocked on it returns ErrClosed, and the
// key's shard forgets the Feed (and may use its fast path again once no
// key of it is followed). It takes the shard mutex once; later calls do
// nothing.
func (f *Feed[K]) Stop() {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.stopped, f.pending, f.head = true, nil, 0
	f.mu.Unlock()
	select {
	case f.ready <- struct{}{}:
	default:
	}
	s, _ := f.t.shardOf(f.key)
	s.lock()
	if kf := s.follows[f.key]; kf != nil {
		kf.feeds = slices.DeleteFunc(kf.feeds, func(g *Feed[K]) bool { return g == f })
		if len(kf.feeds) == 0 {
			delete(s.follows, f.key)
		}
	}
	if len(s.follows) == 0 {
		s.follows = nil
	}
	s.unlock()
}

// push buffers c, or marks a gap once the buffer is full. s.mu is held.
func (f *Feed[K]) push(c KeyChange) {
	f.mu.Lock()
	switch {
	case f.stopped, f.gap:
	case len(f.pending)-f.head >= feedBuffer:
		f.gap, f.pending, f.head = true, nil, 0
	default:
		f.pending = append(f.pending, c)
	}
	f.mu.Unlock()
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// followed reports e's holders to the Feeds of its key if they changed
// since the last report. Called by the transitions that can change
// holders, only while s.follows is not nil. s.mu is held.
func (t *table[K]) followed(s *shard[K], e *entry[K]) {
	kf := s.follows[e.key]
	if kf == nil || sameHolders(e, kf.tokens) {
		return
	}
	kf.tokens = holderTokens(e, kf.tokens[:0])
	c := KeyChange{Holders: t.holdersOf(e), At: time.Now()}
	for i, f := range kf.feeds {
		if i > 0 {
			c.Holders = slices.Clone(c.Holders) // each reader its own
		}
		f.push(c)
	}
}

// sameHolders reports whether e's live holders have exactly tokens.
func sameHolders[K comparable](e *entry[K], tokens []uint64) bool {
	i := 0
	for _, h := range e.holders {
		if h.owner == 0 {
			continue
		}
		if i == len(tokens) || tokens[i] != h.token {
			return false
		}
		i++
	}
	return i == len(tokens)
}

// holderTokens appends the tokens of e's live holders to dst; e may be
// nil (a key without calls).
func holderTokens[K comparable](e *entry[K], dst []uint64) []uint64 {
	if e == nil {
		return dst
	}
	for _, h := range e.holders {
		if h.owner != 0 {
			dst = append(dst, h.token)
		}
	}
	return dst
}

// holdersOf returns e's live holders as Calls reports them, labels
// included (read now: the label behind an owner may go with its flow); e
// may be nil. s.mu is held.
func (t *table[K]) holdersOf(e *entry[K]) []KeyCall {
	if e == nil || e.holding() == 0 {
		return nil
	}
	out := make([]KeyCall, 0, e.holding())
	for h := range (view[K]{e}).holders() {
		c := KeyCall{Owner: h.owner, Mode: t.mode(h.units, false), Held: true, Token: h.token}
		if t.kind == semaphoreKind {
			c.Units = h.units
		}
		if h.info != nil {
			c.Label, c.Since = h.info.label, h.info.since
		}
		if c.Label == "" {
			c.Label = h.owner.Label()
		}
		out = append(out, c)
	}
	return out
}
