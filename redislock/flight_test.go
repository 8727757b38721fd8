package redislock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Package flight on Redis: the Locker is redislock's, the Store Redis
// itself (redisStore, below), and the processes are worker processes
// (the test binary re-executed, process_test.go) of 250 concurrent
// requests each, in package disttest's checks (TestDistributed).

// redisStore is a flight.Store on Redis: each entry is a JSON string
// that expires with the TTL, and a write is fenced by a script that
// keeps the largest token it accepted per key (in a key of its own, in
// the entry's hash slot, so that the script runs on one node of a
// Cluster) and refuses a smaller one.
type redisStore[V any] struct{ rdb redis.UniversalClient }

var fencedSet = redis.NewScript(`
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

func (s redisStore[V]) Get(ctx context.Context, key string) (e flight.Entry[V], ok bool, err error) {
	b, err := s.rdb.Get(ctx, "cache:{"+key+"}").Bytes()
	if err == redis.Nil {
		return e, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &e)
	}
	return e, err == nil, err
}

func (s redisStore[V]) Set(ctx context.Context, key string, e flight.Entry[V], ttl time.Duration, l keylock.Lease) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	keys := []string{"cache:{" + key + "}", "fence:{" + key + "}"}
	ok, err := fencedSet.Run(ctx, s.rdb, keys, l.Token(), b, max(ttl.Milliseconds(), 1)).Bool()
	if err == nil && !ok {
		err = flight.ErrFenced
	}
	return err
}

// A flight.Cache on Redis: the Locker is redislock's, and the Store a
// dozen lines of go-redis (redisStore above): Get decodes a JSON entry,
// Set writes it with an expiry through a Lua script that refuses a
// token below the largest it accepted for the key. Every process that
// runs this code shares one fill per expired key.
func Example_flight() {
	dir, err := os.MkdirTemp("", "redislock-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.NewServer(dir) // a program dials its own server instead
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	locks, err := redislock.New(rdb, "locks/pages")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)
	pages := flight.NewCache[string](locks, redisStore[string]{rdb}, time.Minute)

	render := func(ctx context.Context, l keylock.Lease) (string, error) {
		fmt.Println("rendering under a grant:", l.Token() != 0) // Set fences with its token
		return "<h1>home</h1>", nil
	}
	for range 2 {
		page, err := pages.Get(ctx, "/home", render)
		fmt.Println(page, err)
	}
	// Output:
	// rendering under a grant: true
	// <h1>home</h1> <nil>
	// <h1>home</h1> <nil>
}
