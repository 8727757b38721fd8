package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
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
	k        *backend.Core
	client   redis.UniversalClient
	esc      string // escape(prefix)
	channel  string // where grants are announced
	units    int64  // the semaphore's n; 0 for a Locker
	ttlMs    string // the TTL in ms, as the scripts take it
	sid      string // the session id: random, hex
	proc     string // the Locker's process, as its markers hold it (list.go)
	pubsub   *redis.PubSub
	replicas replicas      // WithReplicas: n 0 for none
	seq      atomic.Uint64 // numbers the entries this Locker writes
	stray    sync.WaitGroup
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
	keys := []string{n.queue, n.counter, n.markers + e.sid}
	args := []any{n.markers, e.channel, member, e.ttlMs, kind, e.proc, c.Label()}
	var v []int64
	var err error
	acks := int64(-1)
	if e.replicas.n > 0 {
		v, acks, err = e.enqueueWait(ctx, key, keys, args)
	} else {
		v, err = enqueueScript.Run(ctx, e.client, keys, args...).Int64Slice()
	}
	if err != nil {
		if unsent(err) {
			return backend.Enqueued{}, backend.Unwritten(err)
		}
		return backend.Enqueued{}, err
	}
	r := backend.Enqueued{Sent: sent, Renewed: true, Session: e.k.Session(key)}
	switch status := v[0]; {
	case status == 1 && len(v) == 3 && acks >= 0 && acks < int64(e.replicas.n):
		// Written, but not known to survive a failover: not granted. The
		// kit removes the named entry (an error leaves it to the janitor).
		return backend.Enqueued{}, fmt.Errorf("%w: the enqueue reached %d of %d replicas within %v", ErrNotReplicated, acks, e.replicas.n, e.replicas.timeout)
	case status == 1 && len(v) == 3:
		r.Token, r.Granted = uint64(v[1]), v[2] == 1
	case status == 0:
		return backend.Enqueued{}, backend.Unwritten(fairlock.ErrWouldBlock)
	case status == 2:
		r.Free = true
	case status == -1 && len(v) == 2:
		return backend.Enqueued{}, backend.SizeError(e.units, v[1])
	default:
		return backend.Enqueued{}, fmt.Errorf("redislock: unexpected reply %v from the enqueue script", v)
	}
	return r, nil
}

// enqueueWait runs the enqueueing script and WAIT in one pipeline on the
// server that holds key's slot (one connection: WAIT counts the
// replicas' acknowledgements of that connection's writes), and returns
// the script's reply and the number of replicas that acknowledged it.
func (e *engine) enqueueWait(ctx context.Context, key string, keys []string, args []any) ([]int64, int64, error) {
	srv, err := e.serverOf(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	run := func() (*redis.Cmd, *redis.Cmd, error) {
		p := srv.Pipeline()
		cmd := enqueueScript.EvalSha(ctx, p, keys, args...)
		wait := p.Do(ctx, "WAIT", e.replicas.n, e.replicas.timeout.Milliseconds())
		_, err := p.Exec(ctx)
		return cmd, wait, err
	}
	cmd, wait, err := run()
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		if err = enqueueScript.Load(ctx, srv).Err(); err == nil {
			cmd, wait, err = run()
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if cmd.Err() != nil {
			return nil, 0, cmd.Err()
		}
		return nil, 0, err
	}
	v, err := cmd.Int64Slice()
	if err != nil {
		return nil, 0, err
	}
	acks, err := wait.Int64()
	return v, acks, err
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

// RemoveAll removes the entries es of key in one script (removeScript):
// the janitor's batch, the finished Waits of a release among them.
func (e *engine) RemoveAll(ctx context.Context, key string, es []backend.Entry) error {
	names := namesOf(e.esc, key)
	args := make([]any, 0, 2+len(es))
	args = append(args, names.markers, e.channel)
	for _, en := range es {
		args = append(args, en.ID)
	}
	return removeScript.Run(ctx, e.client, []string{names.queue, names.markers + e.sid}, args...).Err()
}

// release runs the release script: it removes member from key's queue,
// grants this Locker's calls among those its release granted (the reply
// names them, and gives the Waits' bound: a hand-off within the process
// needs no notice), and
// reports whether member was there with its session alive.
func (e *engine) release(ctx context.Context, key, member string) (bool, error) {
	names := namesOf(e.esc, key)
	v, err := runOnce(ctx, e.client, releaseScript, releaseSrc, []string{names.queue, names.markers + e.sid},
		names.markers, e.channel, member, e.sid).Slice()
	if err != nil {
		return false, err
	}
	if len(v) < 2 {
		return false, fmt.Errorf("redislock: unexpected reply %v from the release script", v)
	}
	if b, _ := v[1].(int64); b > 0 {
		e.k.GrantTurns(key, uint64(b))
	}
	if len(v) > 2 {
		granted := make([]string, 0, len(v)-2)
		for _, m := range v[2:] {
			if s, ok := m.(string); ok {
				granted = append(granted, s)
			}
		}
		e.k.Granted(granted...)
	}
	ok, _ := v[0].(int64)
	return ok == 1, nil
}

// check runs the check script on key's queue for member ("" for none):
// whether member is in the queue (or, for a Wait's, among the Waits),
// how many entries the queue holds (Waits not counted: they hold
// nothing), the Waits' bound (every Wait with a token below it has had
// its turn; 0 with no Wait queued), and the entries that hold the key.
func (e *engine) check(ctx context.Context, key, member string) (present bool, n int64, bound uint64, holders []string, err error) {
	names := namesOf(e.esc, key)
	v, err := checkScript.Run(ctx, e.client, []string{names.queue}, names.markers, e.channel, member).Slice()
	if err != nil {
		return false, 0, 0, nil, err
	}
	if len(v) < 3 {
		return false, 0, 0, nil, fmt.Errorf("redislock: unexpected reply %v from the check script", v)
	}
	p, _ := v[0].(int64)
	n, _ = v[1].(int64)
	if b, _ := v[2].(int64); b > 0 {
		bound = uint64(b)
	}
	for _, m := range v[3:] {
		if s, ok := m.(string); ok {
			holders = append(holders, s)
		}
	}
	return p == 1, n, bound, holders, nil
}

// Shutdown waits for stray renewals and leaves every entry to the kit's
// last removals; the markers die with their TTL.
func (e *engine) Shutdown(ctx context.Context, left []backend.Entry) ([]backend.Entry, error) {
	e.stray.Wait()
	return left, nil
}

var (
	_ backend.Checker      = (*engine)(nil)
	_ backend.Lister       = (*engine)(nil)
	_ backend.BatchRemover = (*engine)(nil)
)

// serverOf returns the server that holds key's slot: its master on a
// Cluster, else the client itself.
func (e *engine) serverOf(ctx context.Context, key string) (redis.Cmdable, error) {
	cc, ok := e.client.(*redis.ClusterClient)
	if !ok {
		return e.client, nil
	}
	m, err := cc.MasterForKey(ctx, namesOf(e.esc, key).queue)
	if err != nil {
		return nil, err
	}
	return m, nil
}
