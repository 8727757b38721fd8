package fairlock_test

import (
	"context"
	"errors"
	"fmt"

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
