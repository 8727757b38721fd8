package redislock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// A program builds a Locker on its go-redis client, under a prefix of its
// own. The address comes from the program's configuration; here, from
// the environment. A Cluster (redis.NewClusterClient) or a Sentinel
// (redis.NewFailoverClient) client fits the same way.
// TestExampleSetup runs this code against a real redis-server.
func Example_setup() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	ctx := context.Background()
	locks, err := redislock.New(rdb, "locks/orders", redislock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	g, err := locks.Lock(ctx, "order-7")
	if err != nil {
		log.Fatal(err)
	}
	// … work on order-7, fencing writes with g.Token() …
	if err := g.Unlock(ctx); err != nil {
		log.Fatal(err) // redislock.ErrLost: the grant ended before Unlock
	}
}

// TestExampleSetup runs Example_setup, which has no Output line (it needs
// a server), against a real redis-server.
func TestExampleSetup(t *testing.T) {
	t.Setenv("REDIS_ADDR", redistest.StartServer(t).Addr())
	Example_setup()
}

// A store fences the writes made under grants with their tokens: it keeps
// the largest token it has accepted for a resource and refuses smaller
// ones, in one atomic step of its own (here a Lua script on the same
// Redis; a SQL store would use UPDATE … WHERE fence < $token). A grant
// that was lost and taken over can then no longer write. The example runs
// its own redis-server with package redistest (for tests and examples
// only); a program dials its server instead, as Example_setup shows.
func Example_fencing() {
	dir, err := os.MkdirTemp("", "redislock-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.NewServer(dir) // a redis-server on a free loopback port
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	locks, err := redislock.New(rdb, "locks/orders")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	// The fenced store: SET the order's state only under a token larger
	// than every token accepted before.
	store := redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'state', ARGV[2])
return 1`)
	write := func(g keylock.Lease, state string) bool {
		ok, err := store.Run(ctx, rdb, []string{"orders:order-7"}, strconv.FormatUint(g.Token(), 10), state).Bool()
		if err != nil {
			log.Fatal(err)
		}
		return ok
	}

	first, err := locks.Lock(ctx, "order-7")
	if err != nil {
		log.Fatal(err)
	}
	first.Unlock(ctx) // say its process paused here, and its grant passed on …
	second, err := locks.Lock(ctx, "order-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the current grant writes:", write(second, "shipped"))
	fmt.Println("the old grant writes:", write(first, "paid"))
	fmt.Println("Unlock:", second.Unlock(ctx))

	// Output:
	// the current grant writes: true
	// the old grant writes: false
	// Unlock: <nil>
}
