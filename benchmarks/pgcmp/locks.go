// Package pgcmp measures pglock beside the two PostgreSQL locks a Go
// service would otherwise write, session advisory locks taken with a
// blocking pg_advisory_lock on a connection of their own per waiter, and
// with the pg_try_advisory_lock polling loop, on one real PostgreSQL
// server and across processes: an uncontended Lock+Unlock, the hand-off
// to a waiter queued in another process, a hot key shared by three
// processes, the order in which queued waiters are granted, and what a
// waiter sees when the holder's process is killed. Each figure is taken
// in interleaved rounds (every round measures every lock, in a rotated
// order), as package rediscmp does for Redis; cmd/pg-compare prints the
// table and pgcmp's Go benchmark runs the same scenarios.
//
// The advisory locks are what most Go code writes by hand: a key hashed
// to 64 bits (FNV-1a), a session-level lock held on the connection that
// took it, so the connection stays out of the pool while the lock is
// held. The blocking form waits in the server's lock queue on that
// connection; the polling form returns its connection between tries and
// sleeps a fixed delay (Config.PollDelay). cirello.io/pglock, a lease
// table with a heartbeat, is not among them: the Go module proxy refused
// it when this was written (403 Forbidden, "This module version is not
// available").
package pgcmp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/pglock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The locks, in the order of the table's columns; an index into Names is
// an implementation.
const (
	PgLock = iota
	Advisory
	Polling
	numImpls
)

// Names are the locks' names, the table's column heads.
var Names = [numImpls]string{"pglock", "pg_advisory_lock", "pg_try_advisory_lock loop"}

// Prefix is pglock's prefix in every process of a comparison.
const Prefix = "pgcmp"

// Config sets what a comparison measures and how each lock waits. The
// zero value of a field means its default (Defaults).
type Config struct {
	Rounds      int           // interleaved rounds
	Uncontended int           // Lock+Unlock pairs per lock and round
	HandOffs    int           // hand-offs per lock and round
	MaxHold     time.Duration // hand-off: the holder keeps the key a random time below this after the waiter queued
	HotDuration time.Duration // hot key: each timed run
	HotG        int           // hot key: goroutines in each of the three processes
	Waiters     int           // grant order: waiters queued per round, spread over three processes
	TTL         time.Duration // pglock's session TTL
	Bound       time.Duration // how long a waiting call waits at most
	PollDelay   time.Duration // the polling loop's sleep between tries
}

// Defaults is the configuration of a full run of cmd/pg-compare.
var Defaults = Config{
	Rounds:      5,
	Uncontended: 200,
	HandOffs:    20,
	MaxHold:     20 * time.Millisecond,
	HotDuration: 2 * time.Second,
	HotG:        4,
	Waiters:     9,
	TTL:         2 * time.Second,
	PollDelay:   10 * time.Millisecond,
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
	setD(&c.PollDelay, d.PollDelay)
	return c
}

// poolSize is the size of each process's pool: a blocking advisory lock
// holds a connection per waiter (and a hot-key goroutine one each),
// pglock's waiters none.
func poolSize(cfg Config) int32 { return int32(max(cfg.HotG, cfg.Waiters) + 8) }

// locks is one process's instance of each lock, on one pool.
type locks struct {
	cfg  Config
	pool *pgxpool.Pool
	pg   *pglock.Locker
}

// newLocks makes the locks on pool.
func newLocks(pool *pgxpool.Pool, cfg Config) (*locks, error) {
	pg, err := pglock.New(pool, Prefix, pglock.WithTTL(cfg.TTL))
	if err != nil {
		return nil, err
	}
	return &locks{cfg: cfg, pool: pool, pg: pg}, nil
}

// close closes pglock's Locker (the advisory locks hold nothing once
// unlocked).
func (l *locks) close() error { return l.pg.Close(context.Background()) }

// errNotGranted is what a lock call returns when it gave up: the wait
// bound passed.
var errNotGranted = errors.New("pgcmp: not granted")

// advisoryKey is the 64-bit advisory lock of key: FNV-1a, as hand-written
// code hashes a string key.
func advisoryKey(key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// lock locks key with implementation impl, waiting at most the bound (and
// no longer than ctx), and returns the function that unlocks it. onWait,
// if not nil, is called once if the call found the key taken and is going
// to wait: for the polling loop when its first try failed; pglock and
// the blocking advisory lock have no such hook, and the server is read
// instead (waiting). The advisory locks keep their connection out of the
// pool until unlock, which runs pg_advisory_unlock on it and returns it.
func (l *locks) lock(ctx context.Context, impl int, key string, onWait func()) (unlock func(context.Context) error, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Bound)
	defer cancel()
	var once sync.Once
	waiting := func() {
		if onWait != nil {
			once.Do(onWait)
		}
	}
	switch impl {
	case PgLock:
		g, err := l.pg.Lock(ctx, key)
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", errNotGranted, err)
		}
		if err != nil {
			return nil, err
		}
		return g.Unlock, nil
	case Advisory, Polling:
		id := advisoryKey(key)
		for {
			conn, err := l.pool.Acquire(ctx)
			if err != nil {
				return nil, wrapBound(ctx, err)
			}
			ok := true
			if impl == Advisory {
				_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", id)
			} else {
				err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&ok)
			}
			if err != nil {
				// A blocking call cut off by ctx leaves the connection in
				// doubt (its lock may be granted later): it is closed.
				conn.Conn().Close(context.Background())
				conn.Release()
				return nil, wrapBound(ctx, err)
			}
			if ok {
				return func(ctx context.Context) error {
					defer conn.Release()
					var released bool
					if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", id).Scan(&released); err != nil {
						return err
					}
					if !released {
						return errors.New("pgcmp: pg_advisory_unlock: the lock was not held")
					}
					return nil
				}, nil
			}
			conn.Release()
			waiting()
			t := time.NewTimer(l.cfg.PollDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, wrapBound(ctx, ctx.Err())
			}
		}
	}
	return nil, fmt.Errorf("pgcmp: no lock %d", impl)
}

// wrapBound marks err as the bound's end if ctx has ended.
func wrapBound(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errNotGranted, err)
	}
	return err
}
