package redislock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/redis/go-redis/v9"
)

// The engine: Redis's protocol under the kit (package backend). A call's
// entry is a member of its key's queue, written by the enqueue script and
// removed by the release script (scripts.go); its session is this
// Locker's marker on the key, which the enqueue sets with the TTL and the
// renewal (session.go) extends; grants reach the waiting calls through
// the prefix's channel (hub.go). This file holds the engine's state and
// the round trips on one entry.

// engine is a Locker's or Semaphore's Redis protocol.
type engine struct {
	k       *backend.Core
	client  redis.UniversalClient
	esc     string // escape(prefix)
	channel string // where grants are announced
	units   int64  // the semaphore's n; 0 for a Locker
	ttlMs   string // the TTL in ms, as the scripts take it
	sid     string // the session id: random, hex
	proc    string // the Locker's process, as its markers hold it (list.go)
	pubsub  *redis.PubSub
	seq     atomic.Uint64 // numbers the entries this Locker writes
	stray   sync.WaitGroup
}

// The modes of an entry, as the scripts spell them.
const (
	modeExclusive = 'x'
	modeShared    = 'r'
	modeUnits     = 'u'
	modeWait      = 'w'
)

// modeByte is the scripts' letter for a call's mode.
func modeByte(m backend.Mode) byte {
	switch m {
	case backend.Shared:
		return modeShared
	case backend.Units:
		return modeUnits
	case backend.Turn:
		return modeWait
	}
	return modeExclusive
}

// newMember returns a fresh entry for c: "sid|seq|mode|w|n".
func (e *engine) newMember(c *backend.Call) string {
	b := make([]byte, 0, len(e.sid)+40)
	b = append(b, e.sid...)
	b = append(b, '|')
	b = strconv.AppendUint(b, e.seq.Add(1), 36)
	b = append(b, '|', modeByte(c.Mode()), '|')
	b = strconv.AppendInt(b, c.Weight(), 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, e.units, 10)
	return string(b)
}

// Enqueue runs the enqueueing script for a fresh entry of c: one round
// trip, which writes the entry (unless a Try would wait, or a Wait finds
// the queue empty), sets this Locker's marker on the key with the TTL,
// and says whether the entry holds the key. The script is idempotent per
// entry, so go-redis may send it again after a lost reply.
func (e *engine) Enqueue(ctx context.Context, c *backend.Call) (backend.Enqueued, error) {
	kind := "l"
	switch {
	case c.Try():
		kind = "t"
	case c.Mode() == backend.Turn:
		kind = "w"
	}
	key := c.Key()
	// Numbered and recorded in one hold of the Core's mutex, so that a
	// renewal's cutoff never passes an entry it cannot list (stale.go).
	mu := e.k.Mu()
	mu.Lock()
	member := e.newMember(c)
	c.NameLocked(member)
	mu.Unlock()
	n := namesOf(e.esc, key)
	sent := time.Now()
	v, err := enqueueScript.Run(ctx, e.client,
		[]string{n.queue, n.counter, n.markers + e.sid},
		n.markers, e.channel, member, e.ttlMs, kind, e.proc, c.Label()).Int64Slice()
	if err != nil {
		return backend.Enqueued{}, err
	}
	r := backend.Enqueued{Sent: sent, Renewed: true, Session: e.k.Session(key)}
	switch status := v[0]; {
	case status == 1 && len(v) == 3:
		r.Token, r.Granted = uint64(v[1]), v[2] == 1
	case status == 0:
		return backend.Enqueued{}, backend.Unwritten(errWouldBlock)
	case status == 2:
		r.Free = true
	case status == -1 && len(v) == 2:
		return backend.Enqueued{}, backend.SizeError(e.units, v[1])
	default:
		return backend.Enqueued{}, fmt.Errorf("redislock: unexpected reply %v from the enqueue script", v)
	}
	return r, nil
}

// Release runs the release script for c's entry, once (runOnce: a second
// run would find the entry gone and report the grant lost).
func (e *engine) Release(ctx context.Context, c *backend.Call) (bool, error) {
	return e.release(ctx, c.Key(), c.ID())
}

// Remove removes an entry with the release script.
func (e *engine) Remove(ctx context.Context, en backend.Entry) error {
	_, err := e.release(ctx, en.Key, en.ID)
	return err
}

// release runs the release script: it removes member from key's queue
// and reports whether it was there with its session alive.
func (e *engine) release(ctx context.Context, key, member string) (bool, error) {
	names := namesOf(e.esc, key)
	n, err := runOnce(ctx, e.client, releaseScript, releaseSrc, []string{names.queue, names.markers + e.sid},
		names.markers, e.channel, member).Int64()
	return n == 1, err
}

// check runs the check script on key's queue for member ("" for none):
// whether member is in the queue, how many entries it holds, and the
// entries that hold the key.
func (e *engine) check(ctx context.Context, key, member string) (present bool, n int64, holders []string, err error) {
	names := namesOf(e.esc, key)
	v, err := checkScript.Run(ctx, e.client, []string{names.queue}, names.markers, e.channel, member).Slice()
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

// WatchLocked does nothing: the subscription delivers every grant.
func (e *engine) WatchLocked(*backend.Call) <-chan struct{} { return nil }

// Refresh is never asked for: the check round re-reads waiting calls.
func (e *engine) Refresh(context.Context, *backend.Call) (<-chan struct{}, error) { return nil, nil }

// UnwatchLocked does nothing: notices are dispatched by entry.
func (e *engine) UnwatchLocked(*backend.Call) {}

// SessionEndedLocked does nothing: the next enqueue on the key sets the
// marker again, removing the dead session's entries first.
func (e *engine) SessionEndedLocked(*backend.Session) {}

// Shutdown waits for stray renewals and leaves every entry to the kit's
// last removals; the markers die with their TTL.
func (e *engine) Shutdown(ctx context.Context, left []backend.Entry) ([]backend.Entry, error) {
	e.stray.Wait()
	return left, nil
}
