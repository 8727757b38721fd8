package debug_test

import (
	"context"
	"fmt"
	"runtime"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// A Locker built WithDebug shows up in Snapshot (and Dump, and Handler)
// while it is open: each held key with its holder and its queue.
func ExampleSnapshot() {
	orders := fairlock.New[string](fairlock.WithDebug(), fairlock.WithName("example-orders"))
	defer orders.Close(context.Background())
	request := owner.NewContext(context.Background())
	g, _ := orders.Lock(request, "order-7")

	queued := make(chan struct{})
	go func() {
		g, err := orders.Lock(context.Background(), "order-7")
		if err == nil {
			g.Unlock()
		}
		close(queued)
	}()
	for orders.Waiters("order-7") == 0 {
		runtime.Gosched()
	}

	for _, st := range debug.Snapshot() {
		if st.Name != "example-orders" {
			continue
		}
		k := st.Held[0]
		fmt.Printf("%s: %d key held, %d waiting\n", st.Name, st.Keys, st.Waiters)
		fmt.Printf("%s held by the request: %v, waiters: %d\n", k.Key, k.Holders[0].Owner == owner.Of(request).String(), len(k.Waiters))
	}
	g.Unlock()
	<-queued
	// Output:
	// example-orders: 1 key held, 1 waiting
	// "order-7" held by the request: true, waiters: 1
}
