// Command anybackend runs the same locking code against the in-process
// lock, etcd or PostgreSQL, chosen by a flag: the code below knows only
// package keylock's interfaces.
//
//	go run ./anybackend -backend inprocess
//	go run ./anybackend -backend etcd                           # an embedded etcd server
//	go run ./anybackend -backend etcd -endpoints host:2379      # your own cluster
//	go run ./anybackend -backend postgres                       # a postgres of its own (Debian's postgresql package)
//	go run ./anybackend -backend postgres -dsn postgres://...   # your own database
//
// Four workers move units between accounts under keylock.LockMany and
// keylock.Do, each on a Locker of its own (in process, views of one
// fairlock.Locker; on etcd, a client and a Locker each, and on
// PostgreSQL a pool and a Locker each, as separate processes would
// have), and the program checks that no unit was lost or made: the total
// is the same at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/pglock"
	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	backend   = flag.String("backend", "inprocess", "where the lock lives: inprocess, etcd or postgres")
	endpoints = flag.String("endpoints", "", "etcd: comma-separated endpoints of your cluster; empty starts an embedded server")
	dsn       = flag.String("dsn", "", "postgres: a connection string for your database; empty starts a server of its own")
	moves     = flag.Int("moves", 50, "transfers per worker")
)

const workers = 4

func main() {
	flag.Parse()
	total, err := run(context.Background(), *backend, *moves)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d transfers by %d workers, total %d before and after: ok\n", *backend, workers**moves, workers, total)
}

// run makes one Locker per worker on backend and runs the workload;
// it returns the accounts' total.
func run(ctx context.Context, backend string, moves int) (int, error) {
	var newLocker func() (keylock.Locker, error)
	switch backend {
	case "inprocess":
		l := fairlock.New[string](fairlock.WithName("anybackend"))
		defer l.Close(ctx)
		newLocker = func() (keylock.Locker, error) { return keylock.InProcess(l), nil }
	case "etcd":
		eps := strings.Split(*endpoints, ",")
		if *endpoints == "" {
			dir, err := os.MkdirTemp("", "anybackend")
			if err != nil {
				return 0, err
			}
			defer os.RemoveAll(dir)
			srv, err := etcdtest.NewServer(dir)
			if err != nil {
				return 0, err
			}
			defer srv.Close()
			eps = srv.Endpoints()
		}
		// One prefix for every Locker: the prefix is the lock's name
		// space, and Lockers on different prefixes never exclude each
		// other.
		prefix := fmt.Sprintf("/anybackend/%d", time.Now().UnixNano())
		newLocker = func() (keylock.Locker, error) {
			client, err := etcdtest.NewClient(eps)
			if err != nil {
				return nil, err
			}
			l, err := etcdlock.New(client, prefix)
			if err != nil {
				client.Close()
				return nil, err
			}
			return closing{l, client.Close}, nil
		}
	case "postgres":
		conn := *dsn
		if conn == "" {
			srv, err := pgtest.NewServer()
			if err != nil {
				return 0, err
			}
			defer srv.Close()
			conn = srv.ConnString()
		}
		prefix := fmt.Sprintf("anybackend/%d", time.Now().UnixNano())
		newLocker = func() (keylock.Locker, error) {
			pool, err := pgxpool.New(ctx, conn)
			if err != nil {
				return nil, err
			}
			l, err := pglock.New(pool, prefix)
			if err != nil {
				pool.Close()
				return nil, err
			}
			return closing{l, func() error { pool.Close(); return nil }}, nil
		}
	default:
		return 0, fmt.Errorf("unknown backend %q: want inprocess, etcd or postgres", backend)
	}
	return transfers(ctx, newLocker, moves)
}

// closing is a Locker whose Close also closes its client.
type closing struct {
	keylock.Locker
	after func() error
}

func (c closing) Close(ctx context.Context) error {
	return errors.Join(c.Locker.Close(ctx), c.after())
}

// transfers is the code that does not care where the lock lives: workers
// move one unit at a time between two random accounts, holding both
// keys (LockMany takes them in one order, so two transfers in opposite
// directions cannot deadlock), and then audit one account under keylock.Do.
func transfers(ctx context.Context, newLocker func() (keylock.Locker, error), moves int) (int, error) {
	accounts := []string{"acct-a", "acct-b", "acct-c"}
	var mu sync.Mutex // guards balance: the lock is what keeps moves whole
	balance := map[string]int{"acct-a": 100, "acct-b": 100, "acct-c": 100}
	read := func(k string) int { mu.Lock(); defer mu.Unlock(); return balance[k] }
	write := func(k string, v int) { mu.Lock(); defer mu.Unlock(); balance[k] = v }

	lockers := make([]keylock.Locker, workers)
	for i := range lockers {
		l, err := newLocker()
		if err != nil {
			return 0, err
		}
		defer l.Close(context.WithoutCancel(ctx))
		lockers[i] = l
	}
	errs := make(chan error, workers)
	for _, l := range lockers {
		go func() {
			for range moves {
				from, to := accounts[rand.IntN(3)], accounts[rand.IntN(3)]
				if from == to {
					continue
				}
				leases, err := keylock.LockMany(ctx, l, from, to)
				if err != nil {
					errs <- err
					return
				}
				// A read, a yield and a write: without the lock, two
				// workers interleave here and a unit is lost or made.
				f, t := read(from), read(to)
				time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
				write(from, f-1)
				write(to, t+1)
				if err := leases.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- keylock.Do(ctx, l.Lock, "acct-a", func(context.Context, keylock.Lease) error {
				if read("acct-a") < -workers*moves {
					return errors.New("acct-a overdrawn beyond every possible move")
				}
				return nil
			})
		}()
	}
	var err error
	for range workers {
		err = errors.Join(err, <-errs)
	}
	total := read("acct-a") + read("acct-b") + read("acct-c")
	if err == nil && total != 300 {
		err = fmt.Errorf("total %d after the transfers, want 300: the lock did not exclude", total)
	}
	return total, err
}
