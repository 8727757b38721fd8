package fairlock_test

import (
	"context"
	"errors"
	"fmt"
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
