package disttest

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
)

// Store is a fenced store on a backend's engine (Kleppmann's "How to do
// distributed locking", 2016): a log per key that only a write fenced
// with a grant's token can append to, and counters. Its methods are safe
// for concurrent use, from any number of processes.
type Store interface {
	// Append appends entry to key's log if a write fenced with token is
	// still accepted, and reports whether it was. A store that keeps the
	// largest token it accepted per key (Redis) accepts a token larger
	// than it; one that checks the grant itself (etcd's IsOwner) accepts
	// the token of the grant of key that is current. Both refuse the write
	// of a grant that has ended once the next grant of key has written.
	Append(ctx context.Context, key string, token uint64, entry string) (bool, error)
	// Log returns key's log, oldest entry first.
	Log(ctx context.Context, key string) ([]string, error)
	// Add adds n to the counter name, atomically, and returns its new
	// value; a counter never written is 0.
	Add(ctx context.Context, name string, n int64) (int64, error)
}

// Backend is what the checks need of a distributed backend, in the test's
// own process. Server, TTL, Expiry, New, Calls and Store are required;
// the checks that need another field are skipped without it (Run).
type Backend struct {
	// Server is what a worker dials (an address, a list of endpoints): it
	// gets it as Worker.Server.
	Server string
	// TTL is the TTL of the workers' Lockers and of New's.
	TTL time.Duration
	// Expiry bounds the time from the moment a process stops (killed or
	// stopped) to the grant of the call queued behind its grant: its TTL
	// and the time the engine and the Lockers take to see it, on a loaded
	// machine.
	Expiry time.Duration
	// New returns a Locker on prefix, on a client of its own, with TTL,
	// closed by t.Cleanup (which fails t if Close fails).
	New func(t testing.TB, prefix string) keylock.Locker
	// Calls returns the number of calls holding or queued on key under
	// prefix, as the engine shows them (the entries in the key's queue).
	Calls func(t testing.TB, prefix, key string) int
	// Store returns a fenced store of the Lockers on prefix, on a client
	// of its own.
	Store func(t testing.TB, prefix string) Store
	// Held, if not nil, checks what the engine shows of the grant of key
	// under prefix with token that a worker reported holding, alone (its
	// entry, and that the token is the entry's).
	Held func(t testing.TB, prefix, key string, token uint64)
	// Cache returns a flight.Store, on a client of its own, that fences
	// its writes with the Lease's token: for the checks FlightOneFill
	// and FlightFillerKilled, whose workers use the same store.
	Cache func(t testing.TB) flight.Store[string]
	// Observed returns a Locker on prefix, made with TTL, WithDebug,
	// WithName(name) and WithObserver(o), closed by t.Cleanup: for
	// the check DebugAndObserver. Kind is the kind its debug views show
	// ("redislock.Locker").
	Observed func(t testing.TB, prefix, name string, o fairlock.Observer) keylock.Locker
	Kind     string
	// Named returns a Locker on prefix, on a client of its own, made with
	// TTL, WithName(name) and, if debug, WithDebug, closed by t.Cleanup;
	// it must list a key's calls (keylock.Lister). WorkerName is the name
	// of a worker's Locker (its package's first default name,
	// "redislock-1"), as listings and debug views in other processes show
	// it. Both are for the scenarios HoldersAcrossProcesses and
	// DebugNamesHolderInOtherProcess, which fail without them.
	Named      func(t testing.TB, prefix, name string, debug bool) keylock.Locker
	WorkerName string
}

// start starts a worker of b doing role on key under prefix.
func (b Backend) start(t testing.TB, role, prefix, key string, args map[string]string) *Proc {
	t.Helper()
	return Start(t, Worker{Role: role, Server: b.Server, Prefix: prefix, Key: key, TTL: b.TTL, Args: args})
}

// AwaitCalls polls b.Calls until key under prefix has n calls, failing t
// after d. A poll, not an ordering: the count decides.
func (b Backend) AwaitCalls(t testing.TB, prefix, key string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := b.Calls(t, prefix, key)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls on %q under %q after %v, want %d", got, key, prefix, d, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// grant is what a Lock running on a goroutine of its own returned, and
// when.
type grant struct {
	lease keylock.Lease
	err   error
	at    time.Time
}

// lockAsync calls l.Lock(ctx, key) on a goroutine of its own and returns
// the channel its result comes on (buffered: the goroutine never blocks).
func lockAsync(ctx context.Context, l keylock.Locker, key string) <-chan grant {
	ch := make(chan grant, 1)
	go func() {
		g, err := l.Lock(ctx, key)
		ch <- grant{g, err, time.Now()}
	}()
	return ch
}

// awaitGrant returns the grant a channel of lockAsync delivers, failing t
// with msg if none comes within d or the Lock failed.
func awaitGrant(t testing.TB, ch <-chan grant, d time.Duration, msg string) grant {
	t.Helper()
	select {
	case g := <-ch:
		if g.err != nil {
			t.Fatalf("%s: %v", msg, g.err)
		}
		return g
	case <-time.After(d):
		t.Fatalf("%s (waited %v)", msg, d)
	}
	return grant{}
}

// mustAppend appends entry to key's log in s fenced with token, failing
// t unless the store accepts it.
func mustAppend(t testing.TB, s Store, key string, token uint64, entry string) {
	t.Helper()
	if ok, err := s.Append(context.Background(), key, token, entry); err != nil || !ok {
		t.Fatalf("the fenced write %q with token %d: accepted %v, %v; want accepted", entry, token, ok, err)
	}
}

// mustUnlock unlocks l, failing t if Unlock fails.
func mustUnlock(t testing.TB, l keylock.Lease) {
	t.Helper()
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock of %q (token %d): %v", l.Key(), l.Token(), err)
	}
}
