package flight_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
)

// Concurrent requests for one user share one query; a request whose
// client gave up returns at once without cancelling the query for the
// others.
func ExampleGroup() {
	var g flight.Group[int, string]
	queried, release := make(chan struct{}), make(chan struct{})
	query := func(ctx context.Context) (string, error) {
		close(queried)
		<-release // the database answers
		return "Ada", nil
	}

	first := g.DoChan(context.Background(), 42, query) // starts the query
	<-queried
	gaveUp, cancel := context.WithCancel(context.Background())
	second := g.DoChan(gaveUp, 42, query) // has joined the query when DoChan returns
	cancel()
	fmt.Println(errors.Is((<-second).Err, context.Canceled)) // at once; the query goes on

	close(release)
	r := <-first
	fmt.Println(r.Val, r.Shared, r.Err)
	// Output:
	// true
	// Ada true <nil>
}

// A panic in the function is an error for every caller, not a crash.
func ExamplePanicError() {
	var g flight.Group[string, int]
	_, _, err := g.Do(context.Background(), "k", func(context.Context) (int, error) {
		panic("template missing")
	})
	var pe *flight.PanicError
	fmt.Println(errors.As(err, &pe), pe.Value)
	// Output:
	// true template missing
}

// mapStore is a Store in a map, for the example: across processes it is
// a shared store (Redis, etcd, SQL), whose Set fences with l.Token().
type mapStore struct {
	mu sync.Mutex
	m  map[string]flight.Entry[string]
}

func (s *mapStore) Get(_ context.Context, key string) (flight.Entry[string], bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	return e, ok, nil
}

func (s *mapStore) Set(_ context.Context, key string, e flight.Entry[string], _ time.Duration, _ keylock.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = e
	return nil
}

// A Cache fills a missing value once, whichever process asks; here the
// lock is in process (keylock.InProcess), on Redis or etcd it is a
// redislock or etcdlock Locker, and the code is the same (redislock's
// Example_flight has a go-redis Store).
func ExampleCache() {
	ctx := context.Background()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	store := &mapStore{m: map[string]flight.Entry[string]{}}
	cache := flight.NewCache[string](keylock.InProcess(l), store, time.Minute)

	fills := 0
	render := func(ctx context.Context, lease keylock.Lease) (string, error) {
		fills++
		return "<h1>home</h1>", nil // the expensive part
	}
	for range 3 {
		page, err := cache.Get(ctx, "page:/home", render)
		fmt.Println(page, err)
	}
	fmt.Println("fills:", fills)
	// Output:
	// <h1>home</h1> <nil>
	// <h1>home</h1> <nil>
	// <h1>home</h1> <nil>
	// fills: 1
}
