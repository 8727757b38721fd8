package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
)

func TestLockManySortsAndDedupes(t *testing.T) {
	l := fairlock.New[string]()
	ctx := context.Background()
	m, err := fairlock.LockMany(ctx, l, "c", "a", "b", "a", "c")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, m.Keys()); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	if l.Len() != 3 {
		t.Fatalf("Len = %d, want 3", l.Len())
	}
	copied := m
	m.Unlock()
	g, _ := l.Lock(ctx, "b") // someone else takes b
	copied.Unlock()          // idempotent: a stale copy leaves b alone
	if !l.Locked("b") || l.Len() != 1 {
		t.Fatal("a second MultiGuard.Unlock released a later grant")
	}
	g.Unlock()
	var zero fairlock.MultiGuard[string]
	zero.Unlock()
}

// TestLockManyAllOrNothing: when a later key fails, every key taken so far
// is released and the error names the failing key.
func TestLockManyAllOrNothing(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	other := owner.NewContext(ctx)

	t.Run("cancelled while waiting", func(t *testing.T) {
		held, _ := l.Lock(other, "b")
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := fairlock.LockMany(cctx, l, "a", "b", "c"); done <- err }()
		waitWaiters(t, l, "b", 1)
		if !l.Locked("a") {
			t.Fatal("LockMany did not take a before waiting for b")
		}
		cancel()
		err := recv(t, done)
		var le *fairlock.LockError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &le) || le.Key != "b" || le.Op != "LockMany" {
			t.Fatalf("err = %v, want a LockMany error naming b and wrapping Canceled", err)
		}
		if l.Locked("a") || l.Locked("c") {
			t.Fatal("LockMany kept keys after failing")
		}
		held.Unlock()
		if l.Len() != 0 {
			t.Fatalf("Len = %d", l.Len())
		}
	})
	t.Run("reentrant", func(t *testing.T) {
		g, _ := l.Lock(ctx, "c")
		_, err := fairlock.LockMany(ctx, l, "a", "c")
		if !errors.Is(err, fairlock.ErrReentrant) {
			t.Fatalf("err = %v, want ErrReentrant", err)
		}
		if l.Locked("a") {
			t.Fatal("a kept after the reentrant failure on c")
		}
		g.Unlock()
	})
	t.Run("closed", func(t *testing.T) {
		cl := fairlock.New[string]()
		g, _ := cl.Lock(other, "b")
		done := make(chan error, 1)
		go func() { _, err := fairlock.LockMany(ctx, cl, "a", "b"); done <- err }()
		waitWaiters(t, cl, "b", 1)
		closed := make(chan error, 1)
		go func() { closed <- cl.Close(ctx) }()
		if err := recv(t, done); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
		g.Unlock()
		if err := recv(t, closed); err != nil {
			t.Fatal(err)
		}
		if cl.Len() != 0 {
			t.Fatalf("Len = %d", cl.Len())
		}
	})
}

// TestLockManyNoKeys: with no keys LockMany takes nothing, and fails where
// every Lock would, on a done context and on a closed Locker, so that an
// empty key list never lets a cancelled caller go on as if granted.
func TestLockManyNoKeys(t *testing.T) {
	l := fairlock.New[string]()
	ctx := context.Background()
	m, err := fairlock.LockMany(ctx, l)
	if err != nil || m.Keys() != nil || l.Len() != 0 {
		t.Fatalf("LockMany() = %v, %v with Len %d; want nothing taken and no error", m.Keys(), err, l.Len())
	}
	m.Unlock()

	cctx, cancel := context.WithCancelCause(ctx)
	cause := errors.New("request gone")
	cancel(cause)
	_, err = fairlock.LockMany(cctx, l, []string{}...)
	var le *fairlock.LockError
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || !errors.As(err, &le) || le.Op != "LockMany" || le.Key != nil {
		t.Fatalf("on a done context: err = %#v, want a LockMany *LockError with no key wrapping Canceled and its cause", err)
	}
	if want := "fairlock: LockMany (no keys) (goroutine#"; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("message %q, want it to start %q", err, want)
	}

	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := fairlock.LockMany(ctx, l); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("on a closed Locker: err = %v, want ErrClosed", err)
	}
}

// TestLockManyOverlappingNeverHangs: many goroutines take overlapping,
// duplicated key sets in arbitrary order; sorted acquisition means none can
// deadlock, and each set is held exclusively.
func TestLockManyOverlappingNeverHangs(t *testing.T) {
	l := fairlock.New[int]()
	const workers, rounds, keys = 16, 200, 6
	var inside [keys]int // guarded by the fairlock keys
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			ctx := owner.NewContext(context.Background())
			for range rounds {
				set := make([]int, 1+rng.IntN(4))
				for i := range set {
					set[i] = rng.IntN(keys) // duplicates on purpose
				}
				m, err := fairlock.LockMany(ctx, l, set...)
				if err != nil {
					t.Error(err)
					return
				}
				for _, k := range m.Keys() {
					if inside[k]++; inside[k] != 1 {
						t.Errorf("key %d has %d holders", k, inside[k])
					}
				}
				for _, k := range m.Keys() {
					inside[k]--
				}
				m.Unlock()
			}
		}()
	}
	wg.Wait()
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
}

func ExampleLockMany() {
	accounts := fairlock.New[string]()
	ctx := context.Background()
	// Transfers lock both accounts; sorted order means two opposite
	// transfers can never deadlock each other.
	m, err := fairlock.LockMany(ctx, accounts, "bob", "alice")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Unlock()
	fmt.Println(m.Keys())
	// Output: [alice bob]
}
