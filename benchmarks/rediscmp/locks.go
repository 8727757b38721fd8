// Package rediscmp measures redislock beside the two Redis locks a Go
// service would otherwise use, github.com/go-redsync/redsync/v4 (on its
// go-redis v9 pool) and github.com/bsm/redislock, on one real Redis server
// and across processes: an uncontended Lock+Unlock, the hand-off to a
// waiter queued in another process, a hot key shared by three processes,
// the order in which queued waiters are granted, and what a waiter sees
// when the holder's process is killed. Each figure is taken in interleaved
// rounds (every round measures every lock, in a rotated order), as the
// in-process comparison of package benchmarks is; cmd/redis-compare
// prints the table and rediscmp's Go benchmarks run the same scenarios.
//
// redsync and bsm/redislock have no queue: a caller that finds the key
// taken sleeps and tries again. They are configured for waiting the way
// their documentation says: redsync with WithTries and a fixed
// WithRetryDelay (its default gives up after 32 tries of a random
// 50–250 ms), bsm/redislock with a RetryStrategy (ExponentialBackoff, at
// its documented minimum of 16 ms) under a context deadline. Both get as
// many tries as the wait bound holds.
package rediscmp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// The locks, in the order of the table's columns; an index into Names is
// an implementation.
const (
	RedisLock = iota
	Redsync
	Bsm
	numImpls
)

// Names are the locks' names, the table's column heads.
var Names = [numImpls]string{"redislock", "redsync", "bsm/redislock"}

// Prefix is redislock's prefix in every process of a comparison.
const Prefix = "rediscmp"

// Config sets what a comparison measures and how each lock waits. The
// zero value of a field means its default (Defaults).
type Config struct {
	Rounds       int           // interleaved rounds
	Uncontended  int           // Lock+Unlock pairs per lock and round
	HandOffs     int           // hand-offs per lock and round
	MaxHold      time.Duration // hand-off: the holder keeps the key a random time below this after the waiter queued
	HotDuration  time.Duration // hot key: each timed run
	HotG         int           // hot key: goroutines in each of the three processes
	Waiters      int           // grant order: waiters queued per round, spread over three processes
	TTL          time.Duration // redislock's session TTL; redsync's expiry and bsm/redislock's TTL
	Bound        time.Duration // how long a waiting call waits at most
	RedsyncDelay time.Duration // redsync's WithRetryDelay
	BsmMin       time.Duration // bsm/redislock's ExponentialBackoff minimum
	BsmMax       time.Duration // and maximum
}

// Defaults is the configuration of a full run of cmd/redis-compare.
var Defaults = Config{
	Rounds:       5,
	Uncontended:  200,
	HandOffs:     20,
	MaxHold:      20 * time.Millisecond,
	HotDuration:  2 * time.Second,
	HotG:         4,
	Waiters:      9,
	TTL:          2 * time.Second,
	RedsyncDelay: 10 * time.Millisecond,
	BsmMin:       16 * time.Millisecond,
	BsmMax:       128 * time.Millisecond,
}

// Quick is a short configuration: one round with few samples, for CI's
// single run of the benchmarks.
var Quick = Config{
	Rounds:      1,
	Uncontended: 20,
	HandOffs:    3,
	HotDuration: 300 * time.Millisecond,
	Waiters:     6,
	TTL:         time.Second,
}

// withDefaults fills the zero fields of c from Defaults; Bound defaults
// to five TTLs, at least 10 s.
func (c Config) withDefaults() Config {
	d := Defaults
	set := func(x *int, v int) {
		if *x <= 0 {
			*x = v
		}
	}
	setD := func(x *time.Duration, v time.Duration) {
		if *x <= 0 {
			*x = v
		}
	}
	set(&c.Rounds, d.Rounds)
	set(&c.Uncontended, d.Uncontended)
	set(&c.HandOffs, d.HandOffs)
	setD(&c.MaxHold, d.MaxHold)
	setD(&c.HotDuration, d.HotDuration)
	set(&c.HotG, d.HotG)
	set(&c.Waiters, d.Waiters)
	setD(&c.TTL, d.TTL)
	setD(&c.Bound, max(5*c.TTL, 10*time.Second))
	setD(&c.RedsyncDelay, d.RedsyncDelay)
	setD(&c.BsmMin, d.BsmMin)
	setD(&c.BsmMax, d.BsmMax)
	return c
}

// locks is one process's instance of each lock, on one client.
type locks struct {
	cfg Config
	rl  *redislock.Locker
	rs  *redsync.Redsync
	bsm *bsmlock.Client
}

// newLocks makes the three locks on client.
func newLocks(client redis.UniversalClient, cfg Config) (*locks, error) {
	rl, err := redislock.New(client, Prefix, redislock.WithTTL(cfg.TTL))
	if err != nil {
		return nil, err
	}
	return &locks{cfg: cfg, rl: rl, rs: redsync.New(goredis.NewPool(client)), bsm: bsmlock.New(client)}, nil
}

// close closes redislock's Locker (the others hold nothing).
func (l *locks) close() error { return l.rl.Close(context.Background()) }

// errNotGranted is what a lock call returns when it gave up: redsync's
// tries ran out, or the wait bound passed.
var errNotGranted = errors.New("rediscmp: not granted")

// lock locks key with implementation impl, waiting at most the bound (and
// no longer than ctx), and returns the function that unlocks it. onWait,
// if not nil, is called once if the call found the key taken and is going
// to wait: for redsync and bsm/redislock when their first try failed, from
// their retry hooks (a WithRetryDelayFunc returning the fixed delay is
// WithRetryDelay; a RetryStrategy that delegates to ExponentialBackoff is
// that strategy); redislock has no such hook, and its queue is read
// instead (QueueKey). keepAlive extends the grant by a TTL: redsync's
// Extend, bsm/redislock's Refresh; redislock's session renews itself, so
// its keepAlive does nothing.
func (l *locks) lock(ctx context.Context, impl int, key string, onWait func()) (unlock func(context.Context) error, keepAlive func(context.Context) error, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Bound)
	defer cancel()
	var once sync.Once
	waiting := func() {
		if onWait != nil {
			once.Do(onWait)
		}
	}
	switch impl {
	case RedisLock:
		g, err := l.rl.Lock(ctx, key)
		if err != nil {
			return nil, nil, err
		}
		// redislock's session renews itself.
		return g.Unlock, func(context.Context) error { return nil }, nil
	case Redsync:
		delay := l.cfg.RedsyncDelay
		m := l.rs.NewMutex("redsync:"+key,
			redsync.WithExpiry(l.cfg.TTL),
			redsync.WithTries(int(l.cfg.Bound/delay)+1),
			redsync.WithRetryDelayFunc(func(int) time.Duration { waiting(); return delay }))
		if err := m.LockContext(ctx); err != nil {
			if errors.Is(err, redsync.ErrFailed) {
				err = fmt.Errorf("%w: %w", errNotGranted, err)
			}
			return nil, nil, err
		}
		return func(ctx context.Context) error {
				ok, err := m.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: unlock failed")
				}
				return err
			}, func(ctx context.Context) error {
				_, err := m.ExtendContext(ctx)
				return err
			}, nil
	case Bsm:
		lk, err := l.bsm.Obtain(ctx, "bsm:"+key, l.cfg.TTL, &bsmlock.Options{
			RetryStrategy: &signalling{bsmlock.ExponentialBackoff(l.cfg.BsmMin, l.cfg.BsmMax), waiting},
		})
		if err != nil {
			if errors.Is(err, bsmlock.ErrNotObtained) || errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w: %w", errNotGranted, err)
			}
			return nil, nil, err
		}
		return lk.Release, func(ctx context.Context) error { return lk.Refresh(ctx, l.cfg.TTL, nil) }, nil
	}
	return nil, nil, fmt.Errorf("rediscmp: no lock %d", impl)
}

// signalling is a bsm/redislock RetryStrategy that calls waiting before
// each backoff of s.
type signalling struct {
	s       bsmlock.RetryStrategy
	waiting func()
}

func (r *signalling) NextBackoff() time.Duration {
	r.waiting()
	return r.s.NextBackoff()
}
