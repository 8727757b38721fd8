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
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock/internal/ctxerr"
	"github.com/redis/go-redis/v9"
)

// A Locker's life: New and NewSemaphore make its core (locker.go) and
// start its goroutines (the dispatch in hub.go, the session renewal in
// session.go, the janitor in janitor.go), Locked reads a key's queue, and
// Close ends it all. The calls on keys are in acquire.go and guard.go.

// startTimeout bounds New's subscription.
const startTimeout = 10 * time.Second

// lockers and semaphores count those made, for default names.
var lockers, semaphores atomic.Int64

// New returns a Locker whose queues live under prefix in the Redis that
// client talks to. Lockers in any number of processes that use the same
// Redis (the same primary, or the same Cluster) and prefix exclude each
// other, key by key. prefix must not be empty. A nil Option is ignored.
//
// New first reads the server's maxmemory-policy (CONFIG GET, on every
// master of a Cluster) and fails with an error naming the policy if it is
// not noeviction: any other policy lets Redis evict the lock's keys under
// memory pressure and grant a key twice. Where CONFIG is refused (renamed,
// or denied by an ACL) it logs one warning through the Locker's logger
// and goes on. It fails with the error of a server it cannot reach.
//
// New subscribes to the prefix's channel before it returns (one round
// trip, bounded by 10 s) and returns an error if that fails; it starts
// three goroutines that Close stops. The client must stay open until
// Close has returned.
func New(client redis.UniversalClient, prefix string, opts ...Option) (*Locker, error) {
	c, err := newCore(client, prefix, 0, "redislock.Locker", opts)
	if err != nil {
		return nil, fmt.Errorf("redislock: New: %w", err)
	}
	return &Locker{c}, nil
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
	c, err := newCore(client, prefix, n, "redislock.Semaphore", opts)
	if err != nil {
		return nil, fmt.Errorf("redislock: NewSemaphore: %w", err)
	}
	return &Semaphore{c}, nil
}

func newCore(client redis.UniversalClient, prefix string, n int64, kind string, opts []Option) (*core, error) {
	if client == nil {
		return nil, errors.New("nil client")
	}
	if prefix == "" {
		return nil, errors.New("empty prefix")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.name == "" {
		if n == 0 {
			cfg.name = "redislock-" + strconv.FormatInt(lockers.Add(1), 10)
		} else {
			cfg.name = "redislock-semaphore-" + strconv.FormatInt(semaphores.Add(1), 10)
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if err := checkEviction(client, cfg.logger, cfg.name); err != nil { // policy.go
		return nil, err
	}
	var id [12]byte
	rand.Read(id[:])
	c := &core{
		client:  client,
		prefix:  prefix,
		esc:     escape(prefix),
		kind:    kind,
		units:   n,
		name:    cfg.name,
		ttl:     cfg.ttl,
		ttlMs:   strconv.FormatInt(cfg.ttl.Milliseconds(), 10),
		logger:  cfg.logger,
		sid:     hex.EncodeToString(id[:]),
		closed:  make(chan struct{}),
		kick:    make(chan struct{}, 1),
		reread:  make(chan struct{}, 1),
		ready:   make(chan struct{}),
		keys:    make(map[string]*keyState),
		entries: make(map[string]*Guard),
		janitor: make(map[string]cleanup),
		idle:    make(chan struct{}, 1),
	}
	c.channel = "{" + c.esc + "}grants"
	c.shut, c.shutNow = context.WithCancel(context.Background())
	c.closing = c.shut.Done()
	c.bg, c.stopBg = context.WithCancel(context.Background())

	c.pubsub = client.Subscribe(c.bg, c.channel)
	c.wg.Add(3)
	go c.listen()
	go c.renewLoop()
	go c.janitorLoop()
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case <-c.ready:
	case <-t.C:
		c.stopBg()
		c.pubsub.Close()
		c.wg.Wait()
		return nil, fmt.Errorf("subscribe %q: no confirmation within %v", c.channel, startTimeout)
	}
	if cfg.observer != nil {
		c.obs = cfg.observer.Register(c.name, c.stats)
	}
	if cfg.debug {
		_, c.unreg = registry.Register(c.name, debugSource{c})
	}
	return c, nil
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
	if l.c.bounded(ctx, func() { _, n, _, cerr = l.c.check(ctx, key, "") }) {
		err = cerr
	} else {
		err = ctxerr.Of(ctx)
	}
	if err != nil {
		return false, lockError("Locked", key, owner.Of(ctx), callError(ctx, err))
	}
	return n > 0, nil
}

// Close closes the Locker. Later calls return ErrClosed, and queued calls
// wake with ErrClosed, removing their entries. Close then waits until
// every grant has been unlocked or ctx is done. Then it stops the
// Locker's goroutines and removes the entries of grants still held (they
// are lost: their Lost channels close and their Unlock returns ErrLost)
// and makes a last try at removals that failed earlier, all bounded by
// 5 s on a context of its own. When Close returns, the Locker has no
// entry in Redis, or, if Redis could not be reached, only entries that
// die with its session's TTL. It unregisters the Locker from the debug
// registry and its Observer.
//
// Close returns nil, or an error wrapping ctx's error that says how many
// grants were still held, or the error of a removal that failed. It is
// safe to call more than once and concurrently; a later call waits for
// the first to finish and returns nil, or an error wrapping its own ctx's
// error if that ends first. A nil ctx means context.Background.
func (l *Locker) Close(ctx context.Context) error { return l.c.close(ctx, "Close") }

// Close closes the Semaphore, as Locker.Close.
func (s *Semaphore) Close(ctx context.Context) error { return s.c.close(ctx, "Close") }

func (c *core) close(ctx context.Context, op string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c.mu.Lock()
	first := !c.isClosed
	if first {
		c.isClosed = true
		c.shutNow()
	}
	c.mu.Unlock()
	if !first {
		select {
		case <-c.closed:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("redislock: %s: %w", op, ctxerr.Of(ctx))
		}
	}
	defer close(c.closed)

	var errs []error
	if held := c.waitIdle(ctx); held > 0 {
		noun := "grants"
		if held == 1 {
			noun = "grant"
		}
		errs = append(errs, fmt.Errorf("redislock: %s: %d %s still held, now lost: %w", op, held, noun, ctxerr.Of(ctx)))
	}
	c.stopBg()
	c.pubsub.Close()
	c.wg.Wait()

	c.mu.Lock()
	for _, g := range c.entries {
		if g.state == held {
			c.loseLocked(g)
			c.janitor[g.member] = cleanup{key: g.key}
		}
	}
	c.mu.Unlock()
	end, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := c.sweep(end); err != nil {
		errs = append(errs, fmt.Errorf("redislock: %s: remove entries: %w", op, err))
	}
	if c.unreg != nil {
		c.unreg()
	}
	if c.obs != nil {
		c.obsMu.Lock()
		c.obsGone = true
		c.obsMu.Unlock()
		c.obs.Unregister()
	}
	return errors.Join(errs...)
}

// waitIdle waits until no call is in progress, no grant is held and no
// enqueueing script is pending, or ctx is done. Calls and pending scripts
// end on their own in bounded time once c.closing is closed, so it waits
// for them even past ctx; it returns how many grants were still held.
func (c *core) waitIdle(ctx context.Context) int {
	done, expired := ctx.Done(), false
	for {
		c.mu.Lock()
		calls, held, pending := c.calls, c.held, c.pending
		c.mu.Unlock()
		if calls == 0 && pending == 0 && (held == 0 || expired) {
			return held
		}
		select {
		case <-c.idle:
		case <-done:
			done, expired = nil, true
		}
	}
}
