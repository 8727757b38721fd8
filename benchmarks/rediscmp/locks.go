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
// The scenarios, the worker processes and the table are those of package
// internal/proccmp, which pgcmp shares; this package gives its locks
// (proccmp.Locks), how they are configured and the header's sentence on
// how each waits.
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
	"strconv"
	"sync"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
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

// Config sets what a comparison measures (the shared proccmp.Config:
// there TTL is redislock's session TTL, redsync's expiry and
// bsm/redislock's TTL) and how redsync and bsm/redislock wait. The zero
// value of a field means its default (Defaults).
type Config struct {
	proccmp.Config
	RedsyncDelay time.Duration // redsync's WithRetryDelay
	BsmMin       time.Duration // bsm/redislock's ExponentialBackoff minimum
	BsmMax       time.Duration // and maximum
}

// Defaults is the configuration of a full run of cmd/redis-compare.
var Defaults = Config{
	Config:       proccmp.Defaults,
	RedsyncDelay: 10 * time.Millisecond,
	BsmMin:       16 * time.Millisecond,
	BsmMax:       128 * time.Millisecond,
}

// Quick is a short configuration: one round with few samples, for CI's
// single run of the benchmarks.
var Quick = Config{Config: proccmp.Quick}

// withDefaults fills the zero fields of c from Defaults; Bound defaults
// to five TTLs, at least 10 s.
func (c Config) withDefaults() Config {
	c.Config = c.Config.WithDefaults()
	proccmp.Default(&c.RedsyncDelay, Defaults.RedsyncDelay)
	proccmp.Default(&c.BsmMin, Defaults.BsmMin)
	proccmp.Default(&c.BsmMax, Defaults.BsmMax)
	return c
}

// locks is one process's instance of each lock, on one client: its
// proccmp.Locks.
type locks struct {
	cfg    Config
	client *redis.Client
	rl     *redislock.Locker
	rs     *redsync.Redsync
	bsm    *bsmlock.Client
}

// open makes the three locks on a client of the server at addr.
func open(addr string, cfg Config) (*locks, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	rl, err := redislock.New(client, Prefix, redislock.WithTTL(cfg.TTL))
	if err != nil {
		client.Close()
		return nil, err
	}
	return &locks{cfg: cfg, client: client, rl: rl, rs: redsync.New(goredis.NewPool(client)), bsm: bsmlock.New(client)}, nil
}

// Close closes redislock's Locker (the others hold nothing) and the
// client.
func (l *locks) Close() error {
	return errors.Join(l.rl.Close(context.Background()), l.client.Close())
}

// errNotGranted is what a lock call returns when it gave up: redsync's
// tries ran out, or the wait bound passed.
var errNotGranted = fmt.Errorf("rediscmp: %w", proccmp.ErrNotGranted)

// Lock locks key with implementation impl, waiting at most the bound (and
// no longer than ctx), and returns the function that unlocks it. onWait,
// if not nil, is called once if the call found the key taken and is going
// to wait: for redsync and bsm/redislock when their first try failed, from
// their retry hooks (a WithRetryDelayFunc returning the fixed delay is
// WithRetryDelay; a RetryStrategy that delegates to ExponentialBackoff is
// that strategy); redislock has no such hook, and its queue is read
// instead (Queued). keepAlive extends the grant by a TTL every third of
// the TTL: redsync's Extend, bsm/redislock's Refresh; redislock's session
// renews itself, so it has none.
func (l *locks) Lock(ctx context.Context, impl int, key string, onWait func()) (unlock, keepAlive func(context.Context) error, err error) {
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
		return g.Unlock, nil, nil
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
			}, l.renewing(func(ctx context.Context) error {
				_, err := m.ExtendContext(ctx)
				return err
			}), nil
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
		return lk.Release, l.renewing(func(ctx context.Context) error { return lk.Refresh(ctx, l.cfg.TTL, nil) }), nil
	}
	return nil, nil, fmt.Errorf("rediscmp: no lock %d", impl)
}

// renewing returns a keepAlive that calls extend every third of the TTL
// until it fails, and returns its error.
func (l *locks) renewing(extend func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for {
			time.Sleep(l.cfg.TTL / 3)
			if err := extend(ctx); err != nil {
				return err
			}
		}
	}
}

// Queued returns the length of redislock's queue of key (QueueKey); the
// others have no queue to read.
func (l *locks) Queued(ctx context.Context, impl int, key string) (int64, bool, error) {
	if impl != RedisLock {
		return 0, false, nil
	}
	n, err := l.client.ZCard(ctx, redislock.QueueKey(Prefix, key)).Result()
	return n, true, err
}

// Rank increments the key's rank counter of impl with an INCR.
func (l *locks) Rank(ctx context.Context, impl int, key string) (int64, error) {
	return l.client.Incr(ctx, "rediscmp:rank:"+strconv.Itoa(impl)+":"+key).Result()
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
