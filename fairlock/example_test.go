package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"runtime"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

func Example() {
	orders := fairlock.New[string](fairlock.WithName("orders"))
	ctx := context.Background()

	g, err := orders.Lock(ctx, "order-7")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Unlock()
	fmt.Println("holding", g.Key())
	// Output: holding order-7
}

// A flow that locks a key it already holds gets ErrReentrant instead of
// deadlocking itself.
func ExampleErrReentrant() {
	l := fairlock.New[string]()
	ctx := owner.NewContext(context.Background()) // one flow, any goroutines
	g, _ := l.Lock(ctx, "k")
	defer g.Unlock()
	_, err := l.Lock(ctx, "k")
	fmt.Println(errors.Is(err, fairlock.ErrReentrant))
	// Output: true
}

func ExampleLocker_TryLock() {
	l := fairlock.New[int]()
	ctx := context.Background()
	g, _ := l.Lock(ctx, 1)
	_, err := l.TryLock(owner.NewContext(ctx), 1)
	fmt.Println(errors.Is(err, fairlock.ErrWouldBlock))
	g.Unlock()
	g, err = l.TryLock(ctx, 1)
	fmt.Println(err)
	g.Unlock()
	// Output:
	// true
	// <nil>
}

// LockMany takes several keys in sorted order, so two calls that name the
// same keys in any order cannot deadlock each other. Duplicates are taken
// once.
func ExampleLockMany() {
	accounts := fairlock.New[string]()
	ctx := context.Background()
	m, err := fairlock.LockMany(ctx, accounts, "bob", "alice", "bob")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Unlock()
	fmt.Println(m.Keys())
	// Output: [alice bob]
}

// Two flows each hold one key and want the other's. With deadlock
// detection the Lock that would close the cycle fails at once with
// ErrDeadlock; its flow releases what it holds, and the other flow goes on.
func ExampleWithDeadlockDetection() {
	l := fairlock.New[string](fairlock.WithDeadlockDetection())
	flow1 := owner.NewContext(context.Background())
	flow2 := owner.NewContext(context.Background())
	a, _ := l.Lock(flow1, "a")
	b, _ := l.Lock(flow2, "b")

	flow2Done := make(chan error)
	go func() {
		g, err := l.Lock(flow2, "a") // waits for flow1
		if err == nil {
			g.Unlock()
		}
		b.Unlock()
		flow2Done <- err
	}()
	for l.Waiters("a") == 0 { // until flow2 is queued on "a"
		runtime.Gosched()
	}

	_, err := l.Lock(flow1, "b") // would wait for flow2, which waits for flow1
	var dl *fairlock.DeadlockError
	fmt.Println(errors.Is(err, fairlock.ErrDeadlock), errors.As(err, &dl), len(dl.Cycle))
	a.Unlock() // flow1 backs off
	fmt.Println(<-flow2Done)
	// Output:
	// true true 2
	// <nil>
}

// Close refuses new calls and wakes queued waiters with ErrClosed at once,
// then waits for the holders to unlock: a graceful shutdown.
func ExampleLocker_Close() {
	l := fairlock.New[string]()
	ctx := context.Background()
	held, _ := l.Lock(ctx, "job-1")

	waiter := make(chan error)
	go func() {
		_, err := l.Lock(ctx, "job-1")
		waiter <- err
	}()
	for l.Waiters("job-1") == 0 {
		runtime.Gosched()
	}

	closed := make(chan error)
	go func() { closed <- l.Close(ctx) }()
	fmt.Println(errors.Is(<-waiter, fairlock.ErrClosed)) // woken at once
	held.Unlock()                                        // the last holder lets Close return
	fmt.Println(<-closed)
	_, err := l.Lock(ctx, "job-2")
	fmt.Println(errors.Is(err, fairlock.ErrClosed))
	// Output:
	// true
	// <nil>
	// true
}

// Readers share a key; a writer waits for them, and readers that come
// after the writer wait for it (no writer starvation).
func ExampleLocker_RLock() {
	catalog := fairlock.New[string]()
	ctx := context.Background()
	r1, _ := catalog.RLock(owner.NewContext(ctx), "sku-1")
	r2, _ := catalog.RLock(owner.NewContext(ctx), "sku-1")
	fmt.Println("two readers hold sku-1:", catalog.Locked("sku-1"))

	_, err := catalog.TryLock(ctx, "sku-1")
	fmt.Println("a writer now:", err != nil)
	r1.Unlock()
	r2.Unlock()
	w, err := catalog.TryLock(ctx, "sku-1")
	fmt.Println("a writer once they left:", err == nil)
	w.Unlock()
	// Output:
	// two readers hold sku-1: true
	// a writer now: true
	// a writer once they left: true
}

// A keyed semaphore: at most 2 concurrent exports per tenant, granted in
// arrival order, each export taking 1 unit and a full re-index all 2.
func ExampleSemaphore() {
	exports := fairlock.NewSemaphore[string](2, fairlock.WithName("exports"))
	defer exports.Close(context.Background())
	ctx := context.Background()

	a, _ := exports.Acquire(owner.NewContext(ctx), "tenant-9", 1)
	b, _ := exports.Acquire(owner.NewContext(ctx), "tenant-9", 1)
	_, err := exports.TryAcquire(owner.NewContext(ctx), "tenant-9", 1)
	fmt.Println("third export:", errors.Is(err, fairlock.ErrWouldBlock))
	other, _ := exports.Acquire(owner.NewContext(ctx), "tenant-4", 2)
	fmt.Println("another tenant is not held up:", other.Key())
	other.Unlock()
	a.Unlock()
	b.Unlock()
	_, err = exports.Acquire(ctx, "tenant-9", 3)
	fmt.Println("more units than a key has:", errors.Is(err, fairlock.ErrInvalidWeight))
	// Output:
	// third export: true
	// another tenant is not held up: tenant-4
	// more units than a key has: true
}

// fencedStore is a store that refuses writes from a grant that has since
// ended: it keeps the largest token it has seen per key and refuses any
// write with a smaller one.
type fencedStore struct {
	largest map[string]uint64
	values  map[string]string
}

func (s *fencedStore) write(key, value string, token uint64) error {
	if token < s.largest[key] {
		return fmt.Errorf("write to %s with token %d refused: a later grant wrote with %d", key, token, s.largest[key])
	}
	s.largest[key], s.values[key] = token, value
	return nil
}

// Fencing: a holder that stalls past its grant (a long GC pause, a stuck
// call) and writes afterwards is refused by a store that compares tokens.
func ExampleGuard_Token() {
	locks := fairlock.New[string]()
	store := &fencedStore{largest: map[string]uint64{}, values: map[string]string{}}
	ctx := context.Background()

	slow, _ := locks.Lock(ctx, "invoice-3")
	staleToken := slow.Token()
	slow.Unlock() // say the holder's grant ended while it was paused

	fast, _ := locks.Lock(ctx, "invoice-3")
	fmt.Println(store.write("invoice-3", "paid", fast.Token()))
	fast.Unlock()

	fmt.Println(store.write("invoice-3", "draft", staleToken) != nil)
	fmt.Println(store.values["invoice-3"])
	// Output:
	// <nil>
	// true
	// paid
}

// Wait lets the work already under way on a key finish, without taking
// the key: here, a cache invalidation waits for the writer that was
// refreshing the entry.
func ExampleLocker_Wait() {
	cache := fairlock.New[string]()
	ctx := context.Background()
	refresh, _ := cache.Lock(owner.NewContext(ctx), "user:42")

	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := cache.Wait(ctx, "user:42"); err == nil {
			fmt.Println("the refresh has finished; user:42 held now:", cache.Locked("user:42"))
		}
	}()
	for cache.Waiters("user:42") == 0 {
		runtime.Gosched()
	}
	refresh.Unlock()
	<-done
	// Output: the refresh has finished; user:42 held now: false
}

// A goroutine that locks a key and hands the Guard to a worker to unlock
// hands the grant over first; its own next Lock of the key then waits for
// the worker instead of returning ErrReentrant.
func ExampleGuard_HandOff() {
	locks := fairlock.New[string]()
	defer locks.Close(context.Background())
	ctx := context.Background()

	g, err := locks.Lock(ctx, "user-1")
	if err != nil {
		log.Fatal(err)
	}
	wctx := owner.NewContext(context.Background()) // the worker's own flow
	g.HandOff(owner.Of(wctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer g.Unlock()
		fmt.Println("worker: done with user-1")
	}()

	g2, err := locks.Lock(ctx, "user-1") // waits for the worker's Unlock
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next holder:", g2.Token() > g.Token())
	g2.Unlock()
	<-done
	// Output:
	// worker: done with user-1
	// next holder: true
}
