package fairlock

import (
	"context"
	"slices"
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
// entry to shard.followed (lock.go). That check, one load of a nil map under a mutex the
// slow path already holds, is all a key nobody follows pays; the
// lock-free fast path pays nothing. followed compares the holders' tokens
// with those it last reported for the key and, only if they differ,
// appends the holders, labels read there, to each Feed's buffer
// (feedbuf.go), under the buffer's own mutex (taken under the shard
// mutex, never the other way round). A
// reader takes the changes from the buffer with Next, outside the shard
// mutex; a buffer that fills (a reader that stopped reading) is dropped
// whole, and its next Next reads the key afresh and says so (Gap). The
// idea is etcd's watch with its compaction error, kept in one process:
// every change in order while the history is kept, an explicit gap when
// it is not.

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
	t   *table[K]
	key K
	buf *feedBuf // what the key's transitions write to
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
	f := &Feed[K]{t: t, key: key, buf: newFeedBuf()}
	s, tag := t.shardOf(key)
	s.lock() // inflates a fast grant of the key: it is among the holders below
	e := s.find(key, tag)
	if s.follows == nil {
		s.follows = make(map[K]*keyFollows)
	}
	kf := s.follows[key]
	if kf == nil {
		kf = &keyFollows{tokens: holderTokens(e, nil)}
		s.follows[key] = kf
	}
	kf.bufs = append(kf.bufs, f.buf)
	f.buf.pending = append(f.buf.pending, feedChange{holders: heldCalls(e), at: time.Now()})
	s.unlock() // stays in slow mode: s.follows is not nil
	f.buf.wake()
	return f, nil
}

// Next returns the oldest change not yet returned, blocking until there
// is one or ctx ends. The first is the key's holders when Follow was
// called. It returns the context's error (context.Cause's where it has
// one) if ctx ends first, and ErrClosed once Stop was called. A change
// whose Gap is set follows a buffer overflow: Next read the key afresh,
// taking its shard mutex once. It allocates the change's Holders.
func (f *Feed[K]) Next(ctx context.Context) (KeyChange, error) {
	b := f.buf
	for {
		b.mu.Lock()
		switch {
		case b.stopped:
			b.mu.Unlock()
			return KeyChange{}, ErrClosed
		case b.gap:
			b.mu.Unlock()
			return f.resync(), nil
		case b.head < len(b.pending):
			c := b.pending[b.head]
			b.pending[b.head] = feedChange{}
			b.head++
			if b.head == len(b.pending) {
				b.pending, b.head = b.pending[:0], 0
			}
			b.mu.Unlock()
			return KeyChange{Holders: f.t.keyCalls(c.holders), At: c.at}, nil
		}
		b.mu.Unlock()
		select {
		case <-b.ready:
		case <-ctx.Done():
			return KeyChange{}, ctxerr.Of(ctx)
		}
	}
}

// resync reads the key's holders afresh after a buffer overflow and
// clears the gap, under the shard mutex so that no change slips between
// the read and the buffer's restart.
func (f *Feed[K]) resync() KeyChange {
	s, tag := f.t.shardOf(f.key)
	s.lock()
	held, at := heldCalls(s.find(f.key, tag)), time.Now()
	b := f.buf
	b.mu.Lock()
	b.gap, b.pending, b.head = false, nil, 0
	b.mu.Unlock()
	s.unlock()
	return KeyChange{Holders: f.t.keyCalls(held), At: at, Gap: true}
}

// Stop ends the Feed: a Next blocked on it returns ErrClosed, and the
// key's shard forgets the Feed (and may use its fast path again once no
// key of it is followed). It takes the shard mutex once; later calls do
// nothing.
func (f *Feed[K]) Stop() {
	b := f.buf
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped, b.pending, b.head = true, nil, 0
	b.mu.Unlock()
	b.wake()
	s, _ := f.t.shardOf(f.key)
	s.lock()
	if kf := s.follows[f.key]; kf != nil {
		kf.bufs = slices.DeleteFunc(kf.bufs, func(x *feedBuf) bool { return x == b })
		if len(kf.bufs) == 0 {
			delete(s.follows, f.key)
		}
	}
	if len(s.follows) == 0 {
		s.follows = nil
	}
	s.unlock()
}

// keyCalls turns holders recorded by a change into KeyCalls, as Calls
// reports holders.
func (t *table[K]) keyCalls(held []heldCall) []KeyCall {
	if len(held) == 0 {
		return nil
	}
	out := make([]KeyCall, len(held))
	for i, h := range held {
		out[i] = KeyCall{Owner: h.owner, Label: h.label, Mode: t.mode(h.units, false), Held: true, Token: h.token, Since: h.since}
		if t.kind == semaphoreKind {
			out[i].Units = h.units
		}
	}
	return out
}
