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
// The scenarios, the worker processes and the table are those of package
// internal/proccmp, which rediscmp shares; this package gives its locks
// (proccmp.Locks), how they are configured and the header's sentence on
// how each waits.
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
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
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

// Config sets what a comparison measures (the shared proccmp.Config:
// there TTL is pglock's session TTL) and how the polling loop waits. The
// zero value of a field means its default (Defaults).
type Config struct {
	proccmp.Config
	PollDelay time.Duration // the polling loop's sleep between tries
}

// Defaults is the configuration of a full run of cmd/pg-compare.
var Defaults = Config{
	Config:    proccmp.Defaults,
	PollDelay: 10 * time.Millisecond,
}

// Quick is a short configuration: one round with few samples, for CI's
// single run of the benchmarks.
var Quick = Config{Config: proccmp.Quick}

// withDefaults fills the zero fields of c from Defaults; Bound defaults
// to five TTLs, at least 10 s.
func (c Config) withDefaults() Config {
	c.Config = c.Config.WithDefaults()
	proccmp.Default(&c.PollDelay, Defaults.PollDelay)
	return c
}

// poolSize is the size of each process's pool: a blocking advisory lock
// holds a connection per waiter (and a hot-key goroutine one each),
// pglock's waiters none.
func poolSize(cfg Config) int32 { return int32(max(cfg.HotG, cfg.Waiters) + 8) }

// locks is one process's instance of each lock, on one pool: its
// proccmp.Locks.
type locks struct {
	cfg  Config
	pool *pgxpool.Pool
	pg   *pglock.Locker
}

// open makes the locks on a pool of the server of dsn, sized for cfg
// (poolSize).
func open(dsn string, cfg Config) (*locks, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = poolSize(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	pg, err := pglock.New(pool, Prefix, pglock.WithTTL(cfg.TTL))
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &locks{cfg: cfg, pool: pool, pg: pg}, nil
}

// Close closes pglock's Locker (the advisory locks hold nothing once
// unlocked) and the pool.
func (l *locks) Close() error {
	err := l.pg.Close(context.Background())
	l.pool.Close()
	return err
}

// errNotGranted is what a lock call returns when it gave up: the wait
// bound passed.
var errNotGranted = fmt.Errorf("pgcmp: %w", proccmp.ErrNotGranted)

// advisoryKey is the 64-bit advisory lock of key: FNV-1a, as hand-written
// code hashes a string key.
func advisoryKey(key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// Lock locks key with implementation impl, waiting at most the bound (and
// no longer than ctx), and returns the function that unlocks it. onWait,
// if not nil, is called once if the call found the key taken and is going
// to wait: for the polling loop when its first try failed; pglock and
// the blocking advisory lock have no such hook, and the server is read
// instead (Queued). The advisory locks keep their connection out of the
// pool until unlock, which runs pg_advisory_unlock on it and returns it.
// No grant needs a keepAlive: pglock's session renews itself, and an
// advisory lock lives with its connection.
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
	case PgLock:
		g, err := l.pg.Lock(ctx, key)
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", errNotGranted, err)
		}
		if err != nil {
			return nil, nil, err
		}
		return g.Unlock, nil, nil
	case Advisory, Polling:
		id := advisoryKey(key)
		for {
			conn, err := l.pool.Acquire(ctx)
			if err != nil {
				return nil, nil, wrapBound(ctx, err)
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
				return nil, nil, wrapBound(ctx, err)
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
				}, nil, nil
			}
			conn.Release()
			waiting()
			t := time.NewTimer(l.cfg.PollDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, nil, wrapBound(ctx, ctx.Err())
			}
		}
	}
	return nil, nil, fmt.Errorf("pgcmp: no lock %d", impl)
}

// wrapBound marks err as the bound's end if ctx has ended.
func wrapBound(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errNotGranted, err)
	}
	return err
}

// callsSQL counts pglock's calls on a key ($1) under Prefix.
const callsSQL = `SELECT count(*) FROM fairlock_calls WHERE prefix = '` + Prefix + `'::bytea AND key = convert_to($1, 'UTF8')`

// lockersSQL counts the sessions that hold or wait for an advisory lock
// ($1, a bigint: its high half is the classid, its low half the objid).
const lockersSQL = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
    AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`

// Queued returns, for pglock, the key's calls; for the blocking advisory
// lock, the sessions that hold or wait for it; the polling loop's
// waiters the server does not see.
func (l *locks) Queued(ctx context.Context, impl int, key string) (int64, bool, error) {
	var n int64
	var err error
	switch impl {
	case PgLock:
		err = l.pool.QueryRow(ctx, callsSQL, key).Scan(&n)
	case Advisory:
		err = l.pool.QueryRow(ctx, lockersSQL, advisoryKey(key)).Scan(&n)
	default:
		return 0, false, nil
	}
	return n, true, err
}

// rankTable is the table of the rank counters, which Start creates.
const rankTable = `CREATE TABLE IF NOT EXISTS pgcmp_rank (key text PRIMARY KEY, n bigint NOT NULL)`

// rankSQL increments a rank counter ($1) and returns its new value.
const rankSQL = `INSERT INTO pgcmp_rank VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = pgcmp_rank.n + 1 RETURNING n`

// Rank increments the key's rank counter of impl, a row of pgcmp_rank.
func (l *locks) Rank(ctx context.Context, impl int, key string) (int64, error) {
	var n int64
	err := l.pool.QueryRow(ctx, rankSQL, strconv.Itoa(impl)+":"+key).Scan(&n)
	return n, err
}
