package keylock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// Code that takes a keylock.Locker locks the same way whether the lock
// is in process (here) or on etcd or Redis.
func ExampleInProcess() {
	ctx := context.Background()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	var locker keylock.Locker = keylock.InProcess(l)

	lease, err := locker.Lock(ctx, "order-7")
	if err != nil {
		panic(err)
	}
	// The view is the Locker itself: its own methods see the grant.
	fmt.Println(lease.Key(), l.Locked("order-7"), lease.Lost() == nil)
	// Another flow is refused, through any view or the Locker.
	other := owner.NewContext(ctx)
	refused, err := locker.TryLock(other, "order-7")
	fmt.Println(refused == nil, errors.Is(err, fairlock.ErrWouldBlock))
	fmt.Println(lease.Unlock(ctx), l.Locked("order-7"))
	// Output:
	// order-7 true true
	// true true
	// <nil> false
}

// Do is "lock, run, unlock" over any backend: fn's context ends if a
// distributed grant is lost, and the key is released however fn ends.
func ExampleDo() {
	ctx := context.Background()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	locker := keylock.InProcess(l)

	balance := map[string]int{"account-1": 100}
	withdraw := func(ctx context.Context, locker keylock.Locker, account string, amount int) error {
		return keylock.Do(ctx, locker.Lock, account, func(ctx context.Context, _ keylock.Lease) error {
			if balance[account] < amount {
				return fmt.Errorf("%s: balance %d, asked for %d", account, balance[account], amount)
			}
			balance[account] -= amount
			return nil
		})
	}
	fmt.Println(withdraw(ctx, locker, "account-1", 60))
	fmt.Println(withdraw(ctx, locker, "account-1", 60))
	fmt.Println(balance["account-1"], l.Locked("account-1"))

	// Shared holds and semaphore units go through Do the same way.
	s := keylock.InProcessSemaphore(fairlock.NewSemaphore[string](4))
	defer s.Close(ctx)
	acquire2 := func(ctx context.Context, key string) (keylock.Lease, error) { return s.Acquire(ctx, key, 2) }
	err := keylock.Do(ctx, acquire2, "pool", func(context.Context, keylock.Lease) error { return nil })
	fmt.Println(err)
	// Output:
	// <nil>
	// account-1: balance 40, asked for 60
	// 40 false
	// <nil>
}

// LockMany takes several keys through any Locker, in key order so that
// two LockMany calls never deadlock, all or nothing.
func ExampleLockMany() {
	ctx := context.Background()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	locker := keylock.InProcess(l)

	leases, err := keylock.LockMany(ctx, locker, "to", "from", "to")
	if err != nil {
		panic(err)
	}
	for _, lease := range leases {
		fmt.Println(lease.Key())
	}
	fmt.Println(leases.Unlock(ctx), l.Len())

	// "to" held by another flow until ctx ends: LockMany takes "from",
	// waits for "to", and gives "from" back.
	g, _ := l.Lock(owner.NewContext(ctx), "to")
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err = keylock.LockMany(short, locker, "from", "to")
	var le *fairlock.LockError
	if errors.As(err, &le) {
		fmt.Println(le.Op, le.Key, errors.Is(err, context.DeadlineExceeded))
	}
	fmt.Println(l.Locked("from"))
	g.Unlock()
	// Output:
	// from
	// to
	// <nil> 0
	// LockMany to true
	// false
}
