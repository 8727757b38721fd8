// Package redislock is fairlock's fair, strict-FIFO keyed lock across
// processes, on Redis 7.0 or newer: a single node, a Sentinel-managed
// primary or a Redis Cluster, through go-redis v9's UniversalClient.
//
// Every call is its own entry in its key's queue on the server (a sorted
// set ordered by arrival), and a call holds the key when the entries
// ahead of it allow it: an exclusive call when it is first, a reader when
// every call ahead is a reader, a semaphore's Acquire(w) when the units
// of every call ahead plus w fit (head-of-line). Enqueue, release, cancel
// and the purge of dead entries are each one Lua script (scripts.go), so
// each is atomic on the server, and FIFO holds across every process that
// uses the same Redis and prefix. The promises are fairlock's:
// ErrReentrant at once for an owner that already holds the key through
// this Locker (checked in this process, without a round trip), Try forms
// that never overtake a queued call, Wait, Close. Errors are
// *fairlock.LockError values naming the key and wrapping fairlock's
// sentinels, a context's error, a Redis error, or ErrLost.
//
// # Sessions and loss
//
// Liveness uses no client clock: each Locker has a random session id and,
// on each key it has calls on, a marker key with the session TTL, which
// Redis expires and the Locker renews every third of the TTL. An entry
// whose session marker has expired is dead, and the first script that
// meets it at the head of a queue removes it, so a crashed or paused
// process blocks others for at most about one TTL however many of its
// entries are queued. A grant can therefore be lost, and Guard.Lost says
// so; Guard.Token, strictly increasing per key, lets a store refuse the
// writes of a grant that is no longer current. docs/distributed.md states
// the failure model, failover included.
//
// # Hand-off
//
// Each Locker keeps one pub/sub subscription, on its prefix's channel.
// Every script that grants entries publishes them there, and the Locker
// wakes its calls among them, without polling and without a round trip.
// A notice missed while the subscription is down is covered by re-reading
// the queues of the waiting calls when it is back, and a waiting Locker
// re-reads each of its queues every third of the TTL (which also purges
// the entries of a holder that died).
//
// # Memory model
//
// For a key k, the n'th successful Unlock of k, by any process, happens
// before the return of the m'th Lock of k for n < m, in the sense a
// single Redis primary gives: the release script runs before the script
// whose result grants the next call. Writes made under a grant are
// ordered with the next holder's only through a store that checks
// fencing tokens.
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	"github.com/redis/go-redis/v9"
)

// A Locker's life: New and NewSemaphore make its core (package backend)
// and engine (engine.go) and start its goroutines (the dispatch in
// hub.go; the kit's session renewal and janitor), Locked reads a key's
// queue, and Close ends it all. The calls on keys are in acquire.go, the
// grant's methods in guard.go.

// startTimeout bounds New's subscription.
const startTimeout = 10 * time.Second

// Locker is a fair, strict-FIFO keyed lock with shared holds, shared by
// every process that makes one with the same Redis and prefix. Make one
// with New; the zero Locker is not usable. All methods are safe for
// concurrent use. It is a keylock.RWLocker; every Lease it returns is a
// *Guard.
//
// A Locker holds one pub/sub connection and three goroutines (the
// subscription's dispatch, the session renewal, and a janitor that
// retries removals that failed), one more per server while a renewal
// round is in flight, and one goroutine per enqueueing script still
// running for a call that returned. Close stops them all.
type Locker struct {
	backend.Locker // Lock, TryLock, RLock, TryRLock, Wait, Close
	e              *engine
}

// Semaphore is a keyed weighted semaphore of n units per key, head-of-line
// FIFO across every process that makes one with the same Redis, prefix
// and n. Make one with NewSemaphore. It is a keylock.Semaphore; every
// Lease it returns is a *Guard. It holds what a Locker holds.
type Semaphore struct {
	backend.Semaphore // Acquire, TryAcquire, Close
	e                 *engine
}

var (
	_ keylock.RWLocker  = (*Locker)(nil)
	_ keylock.Semaphore = (*Semaphore)(nil)
	_ keylock.Lease     = (*Guard)(nil)
	_ keylock.Lister    = (*Locker)(nil)
	_ keylock.Lister    = (*Semaphore)(nil)
)

// New returns a Locker whose queues live under prefix in the Redis that
// client talks to. Lockers in any number of processes that use the same
// Redis (the same primary, or the same Cluster) and prefix exclude each
// other, key by key. prefix must not be empty; it is any string ("locks",
// "/locks/orders": the form etcdlock takes works here too, and names
// other queues than its variants). A nil Option is ignored.
//
// New first reads the server's maxmemory-policy (CONFIG GET, on every
// master of a Cluster) and fails with an error naming the policy if it is
// not noeviction: any other policy lets Redis evict the lock's keys under
// memory pressure and grant a key twice. Where CONFIG is refused (renamed,
// or denied by an ACL) it logs one warning through the Locker's logger
// and goes on. It fails with the error of a server it cannot reach.
//
// New subscribes to the prefix's channel before it returns (one round
// trip, bounded by 10 s and by the client's dial and read timeouts) and
// returns an error wrapping the cause if that fails; it starts three
// goroutines that Close stops. The client must stay open until Close has
// returned.
func New(client redis.UniversalClient, prefix string, opts ...Option) (*Locker, error) {
	k, e, err := start(client, prefix, 0, "redislock.Locker", "redislock", opts)
	if err != nil {
		return nil, fmt.Errorf("redislock: New: %w", err)
	}
	return &Locker{backend.NewLocker(k, guardOf), e}, nil
}

// NewSemaphore returns a Semaphore of n units per key whose queues live
// under prefix, as New. Every process on the prefix must use the same n:
// an Acquire whose key's queue holds a call of another n fails with
// fairlock.ErrInvalidWeight naming both sizes, and writes nothing. A
// Locker and a Semaphore must not share a prefix. It fails if n < 1.
func NewSemaphore(client redis.UniversalClient, prefix string, n int64, opts ...Option) (*Semaphore, error) {
	if n < 1 {
		return nil, fmt.Errorf("redislock: NewSemaphore: %d units per key; want at least 1", n)
	}
	k, e, err := start(client, prefix, n, "redislock.Semaphore", "redislock-semaphore", opts)
	if err != nil {
		return nil, fmt.Errorf("redislock: NewSemaphore: %w", err)
	}
	return &Semaphore{backend.NewSemaphore(k, guardOf), e}, nil
}

// start makes a Locker's or Semaphore's core and engine and subscribes.
func start(client redis.UniversalClient, prefix string, n int64, kind, stem string, opts []Option) (*backend.Core, *engine, error) {
	if client == nil {
		return nil, nil, errors.New("nil client")
	}
	if prefix == "" {
		return nil, nil, errors.New("empty prefix")
	}
	s := backend.NewSettings(opts)
	s.TTL = ttlOf(s.TTL)
	k := backend.New(backend.Config{Package: "redislock", Kind: kind, Size: n, DefaultName: stem}, s)
	if err := checkEviction(client, s.Logger, k.Name()); err != nil { // policy.go
		return nil, nil, err
	}
	var id [12]byte
	rand.Read(id[:])
	e := &engine{
		k:      k,
		client: client,
		esc:    escape(prefix),
		units:  n,
		ttlMs:  strconv.FormatInt(s.TTL.Milliseconds(), 10),
		sid:    hex.EncodeToString(id[:]),
		proc:   procValue(k.Process()),
	}
	e.channel = "{" + e.esc + "}grants"
	for _, v := range s.Engine {
		if r, ok := v.(replicas); ok {
			e.replicas = r
		}
	}
	if err := e.subscribe(); err != nil {
		k.Abort()
		return nil, nil, err
	}
	k.Start(e)
	return k, e, nil
}

// subscribe subscribes to the prefix's channel and starts the dispatch;
// it returns once the server confirmed the subscription, or with the
// cause of the failure.
func (e *engine) subscribe() error {
	ctx, cancel := context.WithTimeout(e.k.Background(), startTimeout)
	defer cancel()
	e.pubsub = e.client.Subscribe(e.k.Background())
	// The first confirmation is read here, so that a failure returns its
	// cause (an unreachable server: the dial's error) rather than a
	// timeout; the dispatch goes on from there.
	if err := e.pubsub.Subscribe(ctx, e.channel); err != nil {
		e.pubsub.Close()
		return fmt.Errorf("subscribe %q: %w", e.channel, err)
	}
	msg, err := e.pubsub.ReceiveTimeout(ctx, startTimeout)
	if err != nil {
		e.pubsub.Close()
		return fmt.Errorf("subscribe %q: %w", e.channel, err)
	}
	if m, ok := msg.(*redis.Subscription); !ok || m.Kind != "subscribe" {
		e.pubsub.Close()
		return fmt.Errorf("subscribe %q: unexpected reply %v", e.channel, msg)
	}
	e.k.Go(e.listen)
	context.AfterFunc(e.k.Background(), func() { e.pubsub.Close() })
	return nil
}

// Locked reports whether key has a holder or a queued call in any process
// at this instant. It is one script: it removes the dead entries at the
// head of the key's queue first, so a crashed holder's entry does not
// count once its session has expired. It returns an error wrapping the
// context's or Redis's error if the script fails, or the context's when
// ctx ends first (the script may still run). A nil ctx panics.
func (l *Locker) Locked(ctx context.Context, key string) (bool, error) {
	if ctx == nil {
		panic("redislock: Locked with a nil context")
	}
	var n int64
	var err, cerr error // n, cerr: written by the goroutine, read only once it returned
	if l.Core().Bounded(ctx, func() { _, n, _, _, cerr = l.e.check(ctx, key, "") }) {
		err = cerr
	} else {
		err = ctx.Err()
	}
	if err != nil {
		return false, backend.CallError(ctx, "Locked", key, err)
	}
	return n > 0, nil
}
