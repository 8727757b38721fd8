// Package keylocktest is the conformance suite of package keylock: Run
// checks a backend's Lockers (and, optionally, its Semaphores) against
// every promise of the keylock interfaces that a test can show. A
// backend calls it from its own tests with a Harness that makes fresh
// Lockers, as implementations of fs.FS call testing/fstest.TestFS and
// net.Conns call golang.org/x/net/nettest.TestConn; madelson's
// DistributedLock runs one abstract suite over ten backends the same way.
//
// # What Run checks
//
// Each check is a subtest of its own (go test -run 'TestX/FIFO' runs one):
//
//   - Exclusion: a key held through one Locker is refused to TryLock on
//     another (fairlock.ErrWouldBlock) and makes a Lock on another queue
//     until it is released.
//   - ExclusionUnderLoad: goroutines on four Lockers, 200 grants of one
//     key in all, each checking that nobody else is inside, that its
//     token is above every earlier one (a fenced store), and bumping an
//     unguarded counter that must end at 200.
//   - FIFO: five calls queued one after the other through different
//     Lockers are granted in that order, one at a time.
//   - TryLockNeverOvertakes: TryLock is refused while a call is queued,
//     also right after the holder's Unlock returns, before the next
//     holder has run; it succeeds on a free key.
//   - Reentrant: an owner (owner.NewContext) that holds a key gets
//     fairlock.ErrReentrant at once from Lock, TryLock, Wait (and RLock,
//     TryRLock) on the same Locker; another owner queues.
//   - Cancellation: a queued call whose context ends returns the
//     context's error, leaves the queue, and the calls behind it are
//     still granted; a deadline works the same way; a done context fails
//     on a free key; nothing is left queued (Waiters or Calls back to 0).
//   - Unlock: Unlock returns nil and a second one does nothing, also once
//     another owner holds the key (a stale Unlock releases nothing).
//   - Tokens: successive grants of a key, through any Locker, Lock or
//     TryLock, get strictly increasing tokens; Key names the key.
//   - Wait: on a free key it returns at once; queued, it returns nil only
//     once the grants held or queued before it are released, and a Lock
//     queued behind it is granted only once its turn has come;
//     cancelled, it leaves the queue.
//   - WaitsTogether: one release frees every Wait queued behind the
//     holder, through any Locker, and the Lock queued behind them.
//   - Deadline: a held grant's Deadline is zero or ahead, never moving
//     back, and keylock.Valid is true; after Unlock, Deadline is a
//     non-zero instant no later than Unlock's return and Valid is false.
//   - HandOff: HandOff moves a grant to another flow of the same Locker
//     (the old owner's Lock waits, the new owner's calls get
//     fairlock.ErrReentrant); owner 0, an owner queued on the key and a
//     released grant are refused.
//   - Do: fn runs holding the key with a live context, Do returns fn's
//     error as it is, the key is free afterwards (a TryLock through
//     another Locker is granted), a panic in fn unlocks and goes on, and
//     a lock that fails is Do's error, fn not run.
//   - LockMany: keylock.LockMany over the backend takes its keys sorted
//     and once each; cancelled while it waits for a held key, it returns
//     a *fairlock.LockError naming that key and keeps nothing;
//     Leases.Unlock frees every key.
//   - Close (the only check that closes a Locker or Semaphore, each in a
//     subtest of its own: Close/WakesWaitersAndWaitsForHolders,
//     Close/ContextEnds, Close/Semaphore): queued calls wake with
//     fairlock.ErrClosed, calls made once Close has begun fail with
//     ErrClosed, Close does not return while a grant is held and returns
//     nil once it is released, a second Close returns nil, and Close with
//     a context that ends while a grant is held returns an error wrapping
//     the context's.
//   - Every failed call returns a nil Lease (a nil interface, never a
//     typed nil inside one): checked wherever a call fails.
//
// With Harness.Lose set, Lost checks that a Lease's Lost channel closes
// when the grant is lost, that keylock.Valid is then false and Deadline a
// non-zero instant in the past, that Unlock then returns an error wrapping
// fairlock.ErrLost (and a second Unlock nil, releasing nothing), that the
// key passes to the next call with a larger token, and that Do (on
// another Locker: the one that lost a grant is not used again) cancels
// fn's context with a cause wrapping ErrLost and returns ErrLost. When
// New's Lockers are keylock.RWLockers, Shared checks shared holds:
// readers through different Lockers share, a reader behind a queued
// writer waits (and TryRLock returns ErrWouldBlock) even while readers
// hold the key, readers queued together are granted together, a writer
// that leaves the queue lets the readers behind it in, and reentrancy in
// shared mode (Lock, RLock, TryRLock and Wait). With Harness.NewSemaphore
// set, Semaphore checks a 3-unit semaphore: fairlock.ErrInvalidWeight for
// weights outside 1..3, units shared across Semaphores, head-of-line FIFO
// (a request of 1 that would fit waits behind a queued request of 2), a
// cancelled head letting the smaller ones in, reentrancy, and every unit
// back once released; Close/Semaphore checks its Close.
//
// # Writing a harness
//
// New must return a Locker that excludes every other Locker New returned
// for the same t: another client, lease or process of the same backend
// (an in-process harness keeps one fairlock.Locker per t and returns
// keylock.InProcess views of it). Register their Close in t.Cleanup, with
// a bounded context and its error reported: the suite unlocks what it
// still holds before those run, so a Close that times out means the
// backend kept a grant that was released (a Close without a bound would
// hang the test instead of failing it). Every harness
// function is called with the subtest's t, so state kept per t starts
// fresh for each check, and keys never repeat across checks.
//
// The suite orders events by what the backend shows, never by sleeping:
// before it relies on a call being queued it polls Waiters or Calls until
// the count says so. Set the one the backend can see, counted over every
// Locker and Semaphore returned for t: Waiters, the calls on key that are
// queued and not granted (in process: Locker.Waiters plus
// Semaphore.Waiters); or Calls, the calls on key holding or queued (etcd,
// Redis: the entries in the key's range). Run fails at once on a harness
// that sets neither, and uses Waiters where both are set. Waiters cannot
// see a holder, so where a check needs to know that a grant was released
// it also takes the key with TryLock.
//
// Within one check every Semaphore has the same size (a distributed
// backend may refuse a second size on the same prefix); checks differ.
//
// The suite's waits are bounded generously (30 s) for backends with
// round trips; a bound is only ever a failure, never a way to order
// events. The load is modest (200 grants of one key). The suite starts
// no goroutine that outlives a subtest.
//
// A minimal in-process harness:
//
//	func TestConformance(t *testing.T) {
//		var mu sync.Mutex
//		lockers := map[testing.TB]*fairlock.Locker[string]{}
//		locker := func(t testing.TB) *fairlock.Locker[string] {
//			mu.Lock()
//			defer mu.Unlock()
//			l, ok := lockers[t]
//			if !ok {
//				l = fairlock.New[string]()
//				lockers[t] = l
//				t.Cleanup(func() {
//					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//					defer cancel()
//					if err := l.Close(ctx); err != nil {
//						t.Errorf("Close: %v", err)
//					}
//				})
//			}
//			return l
//		}
//		keylocktest.Run(t, keylocktest.Harness{
//			New:     func(t testing.TB) keylock.Locker { return keylock.InProcess(locker(t)) },
//			Waiters: func(t testing.TB, key string) int { return locker(t).Waiters(key) },
//		})
//	}
package keylocktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// Harness is what Run needs of a backend. New and one of Waiters and
// Calls are required; Lose and NewSemaphore turn on the checks of loss
// and of the semaphore.
type Harness struct {
	// New returns a Locker that must exclude every other Locker New returned
	// for the same t (another client, lease or process; an in-process harness
	// keeps one fairlock.Locker per t and returns views of it). The harness
	// closes them in t.Cleanup; the suite closes one only in its Close checks,
	// on a subtest of its own.
	New func(t testing.TB) keylock.Locker
	// Waiters and Calls are how the suite knows a call has queued without
	// sleeping; a harness sets the one its backend can see, counted over
	// every Locker and Semaphore it returned for t. Waiters: calls on key
	// queued and not yet granted (in process: Locker.Waiters plus
	// Semaphore.Waiters). Calls: calls holding or queued on key (etcd,
	// Redis: the entries in the key's range).
	Waiters func(t testing.TB, key string) int
	Calls   func(t testing.TB, key string) int
	// Lose, if not nil, makes the backend lose the grant (revoke its lease,
	// delete its key), as a crash or partition would.
	Lose func(t testing.TB, l keylock.Lease)
	// NewSemaphore, if not nil, returns a Semaphore of n units per key, as New.
	NewSemaphore func(t testing.TB, n int64) keylock.Semaphore
}

// Run checks h's backend against the promises of package keylock, each
// in a subtest of t (the package doc lists them). It fails at once if h
// has no New, or neither Waiters nor Calls. Run blocks until every check
// is done; a check waits at most 30 s for any one event before it fails.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("keylocktest: Harness.New is nil")
	}
	if h.Waiters == nil && h.Calls == nil {
		t.Fatal("keylocktest: the Harness sets neither Waiters nor Calls: the suite cannot tell that a call has queued without sleeping")
	}
	checks := []struct {
		name string
		run  func(*env)
	}{
		{"Exclusion", exclusion},
		{"ExclusionUnderLoad", exclusionUnderLoad},
		{"FIFO", fifo},
		{"TryLockNeverOvertakes", tryLockNeverOvertakes},
		{"Reentrant", reentrant},
		{"Cancellation", cancellation},
		{"Unlock", unlock},
		{"Tokens", tokens},
		{"Wait", wait},
		{"WaitsTogether", waitsTogether},
		{"Deadline", deadline},
		{"HandOff", handOff},
		{"Do", do},
		{"LockMany", lockMany},
		{"Close", closeChecks},
		{"Lost", lost},
		{"Shared", shared},
		{"Semaphore", semaphore},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.run(newEnv(t, h)) })
	}
}

// limit bounds every wait of the suite for one event: a call's return, a
// count reaching a value. It is a failure bound, never an ordering.
const limit = 30 * time.Second

// env is one check's state: its t, the harness, and what it must clean up.
type env struct {
	t   *testing.T
	h   Harness
	ctx context.Context // t.Context(): ends as the check ends
	key string          // a key of this check's own

	wg     sync.WaitGroup // goroutines started by goCall
	mu     sync.Mutex     // protects leases
	leases []keylock.Lease
}

func newEnv(t *testing.T, h Harness) *env {
	e := &env{t: t, h: h, ctx: t.Context(), key: "keylocktest/" + t.Name()}
	t.Cleanup(e.release)
	return e
}

// release waits for the check's goroutines (their contexts ended with
// t.Context) and unlocks every Lease the check still holds. It runs
// before the harness closes its Lockers: it is registered again after
// each New.
func (e *env) release() {
	e.wg.Wait()
	e.mu.Lock()
	leases := e.leases
	e.leases = nil
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for _, l := range slices.Backward(leases) {
		_ = l.Unlock(ctx)
	}
}

// track keeps l to be unlocked when the check ends, whatever happens.
func (e *env) track(l keylock.Lease) {
	if l == nil {
		return
	}
	e.mu.Lock()
	e.leases = append(e.leases, l)
	e.mu.Unlock()
}

// newLocker returns a Locker from the harness.
func (e *env) newLocker() keylock.Locker {
	e.t.Helper()
	l := e.h.New(e.t)
	if l == nil {
		e.t.Fatal("keylocktest: Harness.New returned nil")
	}
	e.t.Cleanup(e.release) // before the harness's Close (cleanups run last first)
	return l
}

// lockers returns n Lockers from the harness.
func (e *env) lockers(n int) []keylock.Locker {
	e.t.Helper()
	ls := make([]keylock.Locker, n)
	for i := range ls {
		ls[i] = e.newLocker()
	}
	return ls
}

// newSemaphore returns a Semaphore of n units from the harness.
func (e *env) newSemaphore(n int64) keylock.Semaphore {
	e.t.Helper()
	s := e.h.NewSemaphore(e.t, n)
	if s == nil {
		e.t.Fatal("keylocktest: Harness.NewSemaphore returned nil")
	}
	e.t.Cleanup(e.release)
	return s
}

// flow returns a context for a new owner (owner.NewContext), bounded by
// limit and ending with the check.
func (e *env) flow() context.Context {
	ctx, cancel := context.WithTimeout(owner.NewContext(e.ctx), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// count is the harness's count for key: Waiters if set, else Calls.
func (e *env) count(key string) int {
	if e.h.Waiters != nil {
		return e.h.Waiters(e.t, key)
	}
	return e.h.Calls(e.t, key)
}

// want is the count the harness shows with held calls holding key and
// queued calls queued on it.
func (e *env) want(held, queued int) int {
	if e.h.Waiters != nil {
		return queued
	}
	return held + queued
}

// awaitQueue polls until key has held calls holding it and queued calls
// queued (as Waiters or Calls counts them), failing at once if any of
// pending returns meanwhile: each should have stayed queued.
func (e *env) awaitQueue(key string, held, queued int, pending ...*call) {
	e.t.Helper()
	want := e.want(held, queued)
	deadline := time.Now().Add(limit)
	pause := 100 * time.Microsecond
	for {
		for _, c := range pending {
			if c.returned() {
				e.t.Fatalf("%s returned (%v) while it should have stayed queued", c.name, c.err)
			}
		}
		got := e.count(key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("key %q: the harness counts %d calls, want %d (%d holding, %d queued) within %v", key, got, want, held, queued, limit)
		}
		time.Sleep(pause) // a poll, not an ordering: the count decides
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// countNow fails unless the harness's count for key is, at once, that of
// held calls holding it and queued calls queued.
func (e *env) countNow(key string, held, queued int, when string) {
	e.t.Helper()
	if got, want := e.count(key), e.want(held, queued); got != want {
		e.t.Fatalf("key %q %s: the harness counts %d calls, want %d (%d holding, %d queued)", key, when, got, want, held, queued)
	}
}

// awaitIdle polls until nothing holds or waits for key.
func (e *env) awaitIdle(key string) {
	e.t.Helper()
	e.awaitQueue(key, 0, 0)
}

// call is a lock call running on a goroutine of its own.
type call struct {
	name  string
	done  chan struct{} // closed when the call returned
	lease keylock.Lease // set before done is closed
	err   error
}

func (c *call) returned() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// goCall runs f(ctx) on a goroutine of its own.
func (e *env) goCall(name string, ctx context.Context, f func(context.Context) (keylock.Lease, error)) *call {
	c := &call{name: name, done: make(chan struct{})}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(c.done)
		c.lease, c.err = f(ctx)
		e.track(c.lease)
	}()
	return c
}

// goWait runs l.Wait(ctx, key) on a goroutine of its own.
func (e *env) goWait(name string, ctx context.Context, l keylock.Locker, key string) *call {
	return e.goCall(name, ctx, func(ctx context.Context) (keylock.Lease, error) {
		return nil, l.Wait(ctx, key)
	})
}

// await waits for c to return, failing at once if any of pending returns
// first (each should have stayed queued) and after limit.
func (e *env) await(c *call, pending ...*call) {
	e.t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range pending {
			if p.returned() {
				e.t.Fatalf("%s returned (%v) before %s", p.name, p.err, c.name)
			}
		}
		select {
		case <-c.done:
			for _, p := range pending {
				if p.returned() {
					e.t.Fatalf("%s returned (%v) together with %s, want it still queued", p.name, p.err, c.name)
				}
			}
			return
		case <-tick.C:
		case <-deadline.C:
			e.t.Fatalf("%s did not return within %v", c.name, limit)
		}
	}
}

// granted waits for c and fails unless it returned a Lease for key.
func (e *env) granted(c *call, key string, pending ...*call) keylock.Lease {
	e.t.Helper()
	e.await(c, pending...)
	return e.wantLease(c.name, key, c.lease, c.err)
}

// refused waits for c and fails unless it returned a nil Lease and an
// error wrapping target.
func (e *env) refused(c *call, target error) {
	e.t.Helper()
	e.await(c)
	e.wantErr(c.name, c.lease, c.err, target)
}

// wantLease fails unless a call returned a Lease for key and a nil error.
func (e *env) wantLease(what, key string, l keylock.Lease, err error) keylock.Lease {
	e.t.Helper()
	e.track(l)
	if err != nil {
		e.t.Fatalf("%s: %v, want a grant", what, err)
	}
	if l == nil {
		e.t.Fatalf("%s returned a nil Lease and a nil error", what)
	}
	if got := l.Key(); got != key {
		e.t.Errorf("%s: Lease.Key() = %q, want %q", what, got, key)
	}
	return l
}

// wantErr fails unless a call returned an error wrapping target and a
// nil Lease (a nil interface, never a typed nil inside one).
func (e *env) wantErr(what string, l keylock.Lease, err error, target error) {
	e.t.Helper()
	e.track(l)
	if !errors.Is(err, target) {
		if err == nil {
			e.t.Fatalf("%s succeeded, want an error wrapping %v", what, target)
		}
		e.t.Fatalf("%s: %v, want an error wrapping %v", what, err, target)
	}
	if l != nil {
		e.t.Fatalf("%s failed (%v) but returned a non-nil Lease %#v: a failed call must return a nil interface", what, err, l)
	}
}

// unlock unlocks l and fails on an error.
func (e *env) unlock(what string, l keylock.Lease) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, limit)
	defer cancel()
	if err := l.Unlock(ctx); err != nil {
		e.t.Fatalf("%s: Unlock: %v", what, err)
	}
}

// lock takes key with l.Lock for a new owner, and fails if it cannot.
func (e *env) lock(what string, l keylock.Locker, key string) keylock.Lease {
	e.t.Helper()
	ls, err := l.Lock(e.flow(), key)
	return e.wantLease(what, key, ls, err)
}

// wouldBlock fails unless TryLock of key through l, for a new owner, is
// refused with fairlock.ErrWouldBlock.
func (e *env) wouldBlock(what string, l keylock.Locker, key string) {
	e.t.Helper()
	ls, err := l.TryLock(e.flow(), key)
	e.wantErr(what, ls, err, fairlock.ErrWouldBlock)
}

// free fails unless key is free: a TryLock of it through l, for a new
// owner, is granted (then unlocked). It is how a check sees that a grant
// was released when the harness counts only Waiters, which cannot see a
// holder.
func (e *env) free(what string, l keylock.Locker, key string) {
	e.t.Helper()
	ls, err := l.TryLock(e.flow(), key)
	if err != nil {
		e.t.Fatalf("%s: TryLock: %v, want the key free", what, err)
	}
	e.wantLease(what, key, ls, err)
	e.unlock(what, ls)
}

// later fails unless tok is above before: the fencing order.
func (e *env) later(what string, tok, before uint64) {
	e.t.Helper()
	if tok <= before {
		e.t.Errorf("%s: token %d, want more than the earlier grant's %d", what, tok, before)
	}
}

// exclusion: a key held through one Locker excludes every other.
func exclusion(e *env) {
	ls := e.lockers(3)
	k := e.key
	a := e.lock("Lock through Locker 0", ls[0], k)
	if lost := a.Lost(); lost != nil {
		select {
		case <-lost:
			e.t.Fatal("Lease.Lost() is closed on a grant just made")
		default:
		}
	}
	e.wouldBlock("TryLock through Locker 1 while Locker 0 holds the key", ls[1], k)
	e.wouldBlock("TryLock through Locker 0 by another owner while it holds the key", ls[0], k)
	b := e.goCall("Lock through Locker 2", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[2].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	e.wouldBlock("TryLock through Locker 1 while Locker 2 waits", ls[1], k)
	e.unlock("Locker 0's grant", a)
	lb := e.granted(b, k)
	e.later("the grant after a release", lb.Token(), a.Token())
	e.wouldBlock("TryLock through Locker 0 while Locker 2 holds the key", ls[0], k)
	e.unlock("Locker 2's grant", lb)
	e.awaitIdle(k)
}

// exclusionUnderLoad: goroutines on four Lockers take one key 200 times
// in all, each time checking, under the grant, that nobody else is
// inside and that its token is above every earlier grant's, and bumping
// a counter with a separate load and store, which loses updates unless
// the grants exclude each other.
func exclusionUnderLoad(e *env) {
	const lockers, perLocker, rounds = 4, 2, 25
	ls := e.lockers(lockers)
	k := e.key
	var (
		inside  atomic.Int32
		counter atomic.Int64
		fence   atomic.Uint64 // the largest token a grant has written with
		broken  atomic.Bool   // stop early once a promise is broken
		wg      sync.WaitGroup
	)
	// round takes the key once through l for flow; false: stop.
	round := func(l keylock.Locker, which int, flow context.Context) bool {
		ctx, cancel := context.WithTimeout(flow, limit) // per grant: the whole run may take longer
		defer cancel()
		lease, err := l.Lock(ctx, k)
		if err != nil {
			e.t.Errorf("Lock through Locker %d: %v", which, err)
			return false
		}
		ok := true
		if n := inside.Add(1); n != 1 {
			e.t.Errorf("%d grants of %q held at once", n, k)
			ok = false
		}
		tok := lease.Token()
		if prev := fence.Swap(tok); tok <= prev {
			e.t.Errorf("a grant wrote with token %d after one with %d: a fenced store refuses it", tok, prev)
			ok = false
		}
		v := counter.Load()
		runtime.Gosched() // widen the window a second holder would write in
		counter.Store(v + 1)
		inside.Add(-1)
		if err := lease.Unlock(ctx); err != nil {
			e.t.Errorf("Unlock: %v", err)
			e.track(lease) // released again when the check ends
			return false
		}
		return ok
	}
	for i := range lockers * perLocker {
		wg.Add(1)
		l, flow := ls[i%lockers], owner.NewContext(e.ctx)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds && !broken.Load(); r++ {
				if !round(l, i%lockers, flow) {
					broken.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if broken.Load() {
		return
	}
	if got, want := counter.Load(), int64(lockers*perLocker*rounds); got != want {
		e.t.Errorf("counter = %d after %d grants: updates were lost, so grants overlapped", got, want)
	}
	e.awaitIdle(k)
}

// fifo: five calls queued one after the other through different Lockers
// are granted in that order, one at a time.
func fifo(e *env) {
	const n = 5
	ls := e.lockers(4)
	k := e.key
	holder := e.lock("the first Lock", ls[0], k)
	calls := make([]*call, n)
	for i := range calls {
		l := ls[(i+1)%len(ls)]
		calls[i] = e.goCall(fmt.Sprintf("queued Lock #%d (Locker %d)", i+1, (i+1)%len(ls)), e.flow(),
			func(ctx context.Context) (keylock.Lease, error) { return l.Lock(ctx, k) })
		e.awaitQueue(k, 1, i+1, calls[:i+1]...)
	}
	prev := holder
	e.unlock("the first Lock's grant", holder)
	for i, c := range calls {
		lease := e.granted(c, k, calls[i+1:]...)
		e.later(c.name, lease.Token(), prev.Token())
		e.awaitQueue(k, 1, n-1-i, calls[i+1:]...)
		e.unlock(c.name, lease)
		prev = lease
	}
	e.awaitIdle(k)
}

// tryLockNeverOvertakes: TryLock is refused while a call is queued, even
// in the instant after the holder's Unlock returns.
func tryLockNeverOvertakes(e *env) {
	ls := e.lockers(3)
	k := e.key
	ctx := e.flow()
	if l, err := ls[2].TryLock(ctx, k); err != nil || l == nil {
		e.t.Fatalf("TryLock of a free key: (%v, %v), want a grant", l, err)
	} else {
		e.track(l)
		e.unlock("TryLock's grant", l)
	}
	// With a Lock queued, and right after the holder's Unlock returns,
	// before the queued call has run: the key is the queued call's, and a
	// TryLock must not take it. (A barging lock's TryLock wins that race
	// most of the time; a few rounds make its loss all but certain.)
	for round := range 5 {
		a := e.lock("Lock through Locker 0", ls[0], k)
		b := e.goCall("Lock through Locker 1", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[1].Lock(ctx, k) })
		e.awaitQueue(k, 1, 1, b)
		if round == 0 {
			e.wouldBlock("TryLock through Locker 2 with a Lock queued", ls[2], k)
		}
		e.unlock("Locker 0's grant", a)
		l, err := ls[2].TryLock(ctx, k)
		e.wantErr("TryLock through Locker 2 right after the holder's Unlock, with a Lock queued", l, err, fairlock.ErrWouldBlock)
		lb := e.granted(b, k)
		e.unlock("the queued Lock's grant", lb)
	}
	l, err := ls[2].TryLock(ctx, k)
	l = e.wantLease("TryLock of the key once free again", k, l, err)
	e.unlock("TryLock's grant", l)
	e.awaitIdle(k)
}

// reentrant: an owner that holds a key gets ErrReentrant at once from
// every call on it through the same Locker.
func reentrant(e *env) {
	l := e.newLocker()
	k := e.key
	ctx := e.flow()
	a, err := l.Lock(ctx, k)
	a = e.wantLease("Lock", k, a, err)
	// ctx is bounded by limit: a call that waited instead would fail with
	// a deadline, not ErrReentrant.
	ls, err := l.Lock(ctx, k)
	e.wantErr("Lock by the owner that holds the key", ls, err, fairlock.ErrReentrant)
	ls, err = l.TryLock(ctx, k)
	e.wantErr("TryLock by the owner that holds the key", ls, err, fairlock.ErrReentrant)
	err = l.Wait(ctx, k)
	e.wantErr("Wait by the owner that holds the key", nil, err, fairlock.ErrReentrant)
	if rw, ok := l.(keylock.RWLocker); ok {
		ls, err = rw.RLock(ctx, k)
		e.wantErr("RLock by the owner that holds the key", ls, err, fairlock.ErrReentrant)
		ls, err = rw.TryRLock(ctx, k)
		e.wantErr("TryRLock by the owner that holds the key", ls, err, fairlock.ErrReentrant)
	}
	b := e.goCall("Lock by another owner on the same Locker", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return l.Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	e.unlock("the owner's grant", a)
	lb := e.granted(b, k)
	e.unlock("the other owner's grant", lb)
	// The owner is not marked for good: it may take the key again.
	a, err = l.Lock(ctx, k)
	a = e.wantLease("Lock by the owner after its Unlock", k, a, err)
	e.unlock("the owner's second grant", a)
	e.awaitIdle(k)
}

// cancellation: a queued call whose context ends leaves the queue with
// the context's error, and the queue goes on.
func cancellation(e *env) {
	ls := e.lockers(3)
	k := e.key
	a := e.lock("Lock through Locker 0", ls[0], k)
	bctx, cancelB := context.WithCancel(e.flow())
	defer cancelB()
	b := e.goCall("Lock through Locker 1, then cancelled", bctx, func(ctx context.Context) (keylock.Lease, error) { return ls[1].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	c := e.goCall("Lock through Locker 2, behind the cancelled one", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[2].Lock(ctx, k) })
	e.awaitQueue(k, 1, 2, b, c)
	cancelB()
	e.refused(b, context.Canceled)
	e.awaitQueue(k, 1, 1, c)
	e.unlock("Locker 0's grant", a)
	lc := e.granted(c, k)
	e.later("the call behind the cancelled one", lc.Token(), a.Token())

	// A deadline ends a queued call the same way.
	dctx, cancelD := context.WithTimeout(e.flow(), 50*time.Millisecond)
	defer cancelD()
	d := e.goCall("Lock through Locker 0 with a deadline", dctx, func(ctx context.Context) (keylock.Lease, error) { return ls[0].Lock(ctx, k) })
	e.refused(d, context.DeadlineExceeded)
	w := e.goWait("Wait through Locker 1, then cancelled", bctx, ls[1], k) // bctx is done
	e.refused(w, context.Canceled)
	wctx, cancelW := context.WithCancel(e.flow())
	defer cancelW()
	w = e.goWait("Wait through Locker 1 while Locker 2 holds the key, then cancelled", wctx, ls[1], k)
	e.awaitQueue(k, 1, 1, w)
	cancelW()
	e.refused(w, context.Canceled)
	e.awaitQueue(k, 1, 0)
	e.unlock("Locker 2's grant", lc)
	e.awaitIdle(k)

	// A context that is already done fails even on a free key.
	ctx, cancel := context.WithCancel(e.flow())
	cancel()
	l, err := ls[0].Lock(ctx, k)
	e.wantErr("Lock of a free key with a done context", l, err, context.Canceled)
	l, err = ls[0].TryLock(ctx, k)
	e.wantErr("TryLock of a free key with a done context", l, err, context.Canceled)
	err = ls[0].Wait(ctx, k)
	e.wantErr("Wait on a free key with a done context", nil, err, context.Canceled)
	e.awaitIdle(k)
	l = e.lock("Lock after the cancellations", ls[1], k)
	e.unlock("the last grant", l)
	e.awaitIdle(k)
}

// unlock: Unlock is idempotent, and a stale Unlock releases nothing.
func unlock(e *env) {
	ls := e.lockers(3)
	k := e.key
	a := e.lock("Lock through Locker 0", ls[0], k)
	e.unlock("the first Unlock", a)
	e.unlock("a second Unlock of the same Lease, on a free key", a)
	b := e.lock("Lock through Locker 1 after the release", ls[1], k)
	e.unlock("a third Unlock of the first Lease, while another owner holds the key", a)
	e.wouldBlock("TryLock after a stale Unlock", ls[2], k)
	c := e.goCall("Lock through Locker 2", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[2].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, c)
	e.unlock("a fourth Unlock of the first Lease, with a call queued", a)
	e.awaitQueue(k, 1, 1, c)
	e.unlock("the second grant", b)
	lc := e.granted(c, k)
	e.unlock("a second Unlock of the second grant, while the third holds the key", b)
	e.wouldBlock("TryLock after a double Unlock", ls[0], k)
	e.unlock("the third grant", lc)
	e.awaitIdle(k)
}

// tokens: successive grants of a key get strictly increasing tokens.
func tokens(e *env) {
	ls := e.lockers(3)
	k := e.key
	var prev uint64
	for i := range 9 {
		l := ls[i%len(ls)]
		ctx := e.flow()
		var lease keylock.Lease
		var err error
		what := fmt.Sprintf("grant %d (Lock through Locker %d)", i+1, i%len(ls))
		if i%2 == 1 {
			what = fmt.Sprintf("grant %d (TryLock through Locker %d)", i+1, i%len(ls))
			lease, err = l.TryLock(ctx, k)
		} else {
			lease, err = l.Lock(ctx, k)
		}
		lease = e.wantLease(what, k, lease, err)
		if i > 0 {
			e.later(what, lease.Token(), prev)
		}
		prev = lease.Token()
		e.unlock(what, lease)
	}
	e.awaitIdle(k)
}

// wait: Wait takes a turn in the queue and holds nothing.
func wait(e *env) {
	ls := e.lockers(3)
	k := e.key
	if err := ls[0].Wait(e.flow(), k); err != nil {
		e.t.Fatalf("Wait on a free key: %v", err)
	}
	e.awaitIdle(k)

	// Wait behind a holder, with a Lock queued behind the Wait.
	a := e.lock("Lock through Locker 0", ls[0], k)
	w := e.goWait("Wait through Locker 1", e.flow(), ls[1], k)
	e.awaitQueue(k, 1, 1, w)
	c := e.goCall("Lock through Locker 2, behind the Wait", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[2].Lock(ctx, k) })
	e.awaitQueue(k, 1, 2, w, c)
	e.unlock("Locker 0's grant", a)
	lc := e.granted(c, k)
	// The Lock behind the Wait is granted the instant the Wait's turn
	// comes: the Wait returns, and its entry goes (a backend may grant
	// the Lock before the Wait's own record is removed).
	e.await(w)
	if w.err != nil {
		e.t.Fatalf("Wait: %v, want nil once the holder released", w.err)
	}
	e.awaitQueue(k, 1, 0)

	// Wait behind a queued Lock returns only once that Lock has been
	// granted and released.
	d := e.goCall("Lock through Locker 0", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[0].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, d)
	w = e.goWait("Wait through Locker 1, behind a queued Lock", e.flow(), ls[1], k)
	e.awaitQueue(k, 1, 2, d, w)
	e.wouldBlock("TryLock with a Wait queued", ls[2], k)
	e.unlock("Locker 2's grant", lc)
	ld := e.granted(d, k, w)
	e.awaitQueue(k, 1, 1, w)
	e.unlock("the Lock ahead of the Wait", ld)
	e.await(w)
	if w.err != nil {
		e.t.Fatalf("Wait: %v, want nil once the Lock ahead released", w.err)
	}
	e.awaitIdle(k)
}

// do: Do holds the key while fn runs and releases it after, also on a
// panic.
func do(e *env) {
	ls := e.lockers(2)
	k := e.key
	errFn := errors.New("keylocktest: fn's error")
	ran := false
	err := keylock.Do(e.flow(), ls[0].Lock, k, func(ctx context.Context, _ keylock.Lease) error {
		ran = true
		if ctx.Err() != nil {
			e.t.Errorf("fn's context is done while fn runs: %v", context.Cause(ctx))
		}
		e.wouldBlock("TryLock through another Locker while Do's fn runs", ls[1], k)
		return errFn
	})
	if !ran {
		e.t.Fatal("Do did not run fn")
	}
	if err != errFn {
		e.t.Errorf("Do returned %v, want fn's error as it is", err)
	}
	e.free("TryLock after Do returned", ls[1], k)
	e.awaitIdle(k)

	func() {
		defer func() {
			if r := recover(); r != errFn {
				e.t.Errorf("recovered %v from Do, want fn's panic value", r)
			}
		}()
		_ = keylock.Do(e.flow(), ls[0].Lock, k, func(context.Context, keylock.Lease) error { panic(errFn) })
	}()
	e.free("TryLock after Do's fn panicked", ls[1], k)

	// A failed lock: fn does not run, Do returns the error.
	a := e.lock("Lock through Locker 1", ls[1], k)
	err = keylock.Do(e.flow(), ls[0].TryLock, k, func(context.Context, keylock.Lease) error {
		e.t.Error("Do ran fn although its lock failed")
		return nil
	})
	e.wantErr("Do with a TryLock of a held key", nil, err, fairlock.ErrWouldBlock)
	e.unlock("Locker 1's grant", a)
	e.awaitIdle(k)
}

// lockMany: keylock.LockMany over the backend: all or nothing.
func lockMany(e *env) {
	ls := e.lockers(2)
	k1, k2, k3 := e.key+"/1", e.key+"/2", e.key+"/3"
	many, err := keylock.LockMany(e.flow(), ls[0], k3, k1, k2, k1)
	for _, l := range many {
		e.track(l)
	}
	if err != nil {
		e.t.Fatalf("LockMany of free keys: %v", err)
	}
	if len(many) != 3 || many[0].Key() != k1 || many[1].Key() != k2 || many[2].Key() != k3 {
		e.t.Fatalf("LockMany returned %d Leases, want three sorted by key", len(many))
	}
	for _, k := range []string{k1, k2, k3} {
		e.wouldBlock("TryLock of a key LockMany holds", ls[1], k)
	}
	// k2 free, k3 held: LockMany takes k2, queues for k3, and gives k2
	// back when its context ends.
	e.unlock("LockMany's grant of "+k2, many[1])
	ctx, cancel := context.WithCancel(e.flow())
	defer cancel()
	var other keylock.Leases
	c := e.goCall("LockMany of a free key and a held one", ctx, func(ctx context.Context) (keylock.Lease, error) {
		var err error
		other, err = keylock.LockMany(ctx, ls[1], k3, k2)
		for _, l := range other {
			e.track(l)
		}
		return nil, err
	})
	e.awaitQueue(k3, 1, 1, c)
	e.wouldBlock("TryLock of a key LockMany took while it waits for the next", ls[0], k2)
	cancel()
	e.await(c)
	var le *fairlock.LockError
	if err := c.err; !errors.As(err, &le) || le.Op != "LockMany" || le.Key != any(k3) || !errors.Is(err, context.Canceled) || other != nil {
		e.t.Fatalf("LockMany cancelled while it waited for a held key: (%v, %v), want nil and a *fairlock.LockError with Op LockMany naming %q and wrapping context.Canceled", other, err, k3)
	}
	// LockMany took k2 and gave it back: it is free again.
	l, err := ls[1].TryLock(e.flow(), k2)
	l = e.wantLease("TryLock of a key a failed LockMany gave back", k2, l, err)
	e.unlock("TryLock's grant", l)
	if err := many.Unlock(e.flow()); err != nil {
		e.t.Fatalf("Leases.Unlock: %v", err)
	}
	for _, k := range []string{k1, k2, k3} {
		e.free("TryLock of a key after Leases.Unlock", ls[1], k)
		e.awaitIdle(k)
	}
}

// closeChecks: Close wakes waiters with ErrClosed, waits for holders and
// refuses later calls; the only check that closes a Locker or Semaphore.
// Each part has a subtest of its own, so that the Lockers it closes are
// not the ones another part uses (an in-process harness returns views of
// one Locker per t).
func closeChecks(e *env) {
	e.t.Run("WakesWaitersAndWaitsForHolders", func(t *testing.T) { closeWakes(newEnv(t, e.h)) })
	e.t.Run("ContextEnds", func(t *testing.T) { closeContextEnds(newEnv(t, e.h)) })
	e.t.Run("Semaphore", func(t *testing.T) { closeSemaphore(newEnv(t, e.h)) })
}

// closeWakes: Close wakes queued calls with ErrClosed, waits for the
// holder, and refuses every later call; a second Close returns nil.
func closeWakes(e *env) {
	l := e.newLocker()
	k := e.key
	a := e.lock("Lock through the Locker to close", l, k)
	b := e.goCall("Lock queued on the Locker to close", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return l.Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	w := e.goWait("Wait queued on the Locker to close", e.flow(), l, k)
	e.awaitQueue(k, 1, 2, b, w)
	closed := e.goCall("Close", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return nil, l.Close(ctx) })
	e.refused(b, fairlock.ErrClosed)
	e.refused(w, fairlock.ErrClosed)
	e.awaitQueue(k, 1, 0, closed)
	// Calls made once Close has begun fail with ErrClosed, while Close
	// still waits for the holder: each of them is also time in which a
	// Close that does not wait would return, and is caught below.
	ctx := e.flow()
	ls, err := l.Lock(ctx, k)
	e.wantErr("Lock after Close", ls, err, fairlock.ErrClosed)
	ls, err = l.TryLock(ctx, k)
	e.wantErr("TryLock after Close", ls, err, fairlock.ErrClosed)
	e.wantErr("Wait after Close", nil, l.Wait(ctx, k), fairlock.ErrClosed)
	if rw, ok := l.(keylock.RWLocker); ok {
		ls, err = rw.RLock(ctx, k)
		e.wantErr("RLock after Close", ls, err, fairlock.ErrClosed)
		ls, err = rw.TryRLock(ctx, k)
		e.wantErr("TryRLock after Close", ls, err, fairlock.ErrClosed)
	}
	e.countNow(k, 1, 0, "after the calls refused by Close")
	if closed.returned() {
		e.t.Fatalf("Close returned (%v) while a grant of its Locker was still held: it must wait for the holder", closed.err)
	}
	e.unlock("the grant held through Close", a)
	e.await(closed)
	if closed.err != nil {
		e.t.Fatalf("Close once its holder released: %v", closed.err)
	}
	if err := l.Close(ctx); err != nil {
		e.t.Errorf("a second Close: %v, want nil", err)
	}
	e.awaitIdle(k)
}

// closeContextEnds: Close whose context ends while a grant is held
// returns an error wrapping the context's.
func closeContextEnds(e *env) {
	l := e.newLocker()
	k := e.key
	h := e.lock("Lock through the Locker to close", l, k)
	ctx, cancel := context.WithTimeout(e.flow(), 50*time.Millisecond)
	defer cancel()
	if err := l.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		e.t.Errorf("Close with a grant held until its context ended: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	_ = h.Unlock(e.flow()) // nil, or ErrLost where Close gave the grant up
	e.awaitIdle(k)
}

// closeSemaphore: Semaphore.Close wakes queued requests with ErrClosed,
// waits for the holder and refuses later calls.
func closeSemaphore(e *env) {
	if e.h.NewSemaphore == nil {
		e.t.Skip("the Harness has no NewSemaphore")
	}
	s := e.newSemaphore(2)
	k := e.key
	u, err := s.Acquire(e.flow(), k, 2)
	u = e.wantLease("Acquire(2) of the Semaphore to close", k, u, err)
	q := e.goCall("Acquire(1) queued on the Semaphore to close", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return s.Acquire(ctx, k, 1) })
	e.awaitQueue(k, 1, 1, q)
	closed := e.goCall("Semaphore.Close", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return nil, s.Close(ctx) })
	e.refused(q, fairlock.ErrClosed)
	e.awaitQueue(k, 1, 0, closed)
	ctx := e.flow()
	l, err := s.Acquire(ctx, k, 1)
	e.wantErr("Acquire after Close", l, err, fairlock.ErrClosed)
	l, err = s.TryAcquire(ctx, k, 1)
	e.wantErr("TryAcquire after Close", l, err, fairlock.ErrClosed)
	e.countNow(k, 1, 0, "after the calls refused by Close")
	if closed.returned() {
		e.t.Fatalf("Semaphore.Close returned (%v) while units were still held: it must wait for the holder", closed.err)
	}
	e.unlock("the units held through Close", u)
	e.await(closed)
	if closed.err != nil {
		e.t.Fatalf("Semaphore.Close once its holder released: %v", closed.err)
	}
	if err := s.Close(ctx); err != nil {
		e.t.Errorf("a second Semaphore.Close: %v, want nil", err)
	}
	e.awaitIdle(k)
}

// lost: with Lose, a lost grant closes Lost, its Unlock wraps ErrLost,
// the key passes on, and Do cancels fn.
func lost(e *env) {
	if e.h.Lose == nil {
		e.t.Skip("the Harness has no Lose")
	}
	ls := e.lockers(3)
	k := e.key
	a := e.lock("Lock through Locker 0", ls[0], k)
	lostCh := a.Lost()
	if lostCh == nil {
		e.t.Fatal("Lease.Lost() is nil, but the Harness can Lose a grant")
	}
	select {
	case <-lostCh:
		e.t.Fatal("Lost is closed on a grant that was not lost")
	default:
	}
	b := e.goCall("Lock through Locker 1", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[1].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	e.h.Lose(e.t, a)
	select {
	case <-lostCh:
	case <-time.After(limit):
		e.t.Fatalf("Lost not closed within %v of Lose", limit)
	}
	if keylock.Valid(a) {
		e.t.Error("Valid is true for a grant whose Lost is closed")
	}
	if d := a.Deadline(); d.IsZero() || d.After(time.Now()) {
		e.t.Errorf("Deadline of a lost grant is %v; want a non-zero instant in the past", d)
	}
	lb := e.granted(b, k)
	e.later("the grant after a lost one", lb.Token(), a.Token())
	ctx := e.flow()
	if err := a.Unlock(ctx); !errors.Is(err, fairlock.ErrLost) {
		e.t.Errorf("Unlock of a lost grant: %v, want an error wrapping fairlock.ErrLost", err)
	}
	if err := a.Unlock(ctx); err != nil {
		e.t.Errorf("a second Unlock of a lost grant: %v, want nil", err)
	}
	e.wouldBlock("TryLock after a stale Unlock of a lost grant", ls[2], k)
	e.unlock("the grant after the lost one", lb)
	e.awaitIdle(k)

	// Do cancels fn's context when the grant is lost. Through Locker 2:
	// the suite does not assume that a Locker that lost a grant (as in a
	// crash) takes new ones.
	leases := make(chan keylock.Lease, 1)
	lock := func(ctx context.Context, key string) (keylock.Lease, error) {
		l, err := ls[2].Lock(ctx, key)
		if err == nil {
			leases <- l
		}
		return l, err
	}
	var cause error
	do := e.goCall("Do whose grant is lost", e.flow(), func(ctx context.Context) (keylock.Lease, error) {
		return nil, keylock.Do(ctx, lock, k, func(ctx context.Context, _ keylock.Lease) error {
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
				return ctx.Err()
			case <-time.After(limit):
				return errors.New("keylocktest: fn's context did not end within the limit of the grant's loss")
			}
		})
	})
	var l keylock.Lease
	select {
	case l = <-leases:
		e.track(l)
	case <-do.done:
		e.t.Fatalf("Do returned before it locked: %v", do.err)
	case <-time.After(limit):
		e.t.Fatalf("Do did not lock within %v", limit)
	}
	e.h.Lose(e.t, l)
	e.await(do)
	if !errors.Is(cause, fairlock.ErrLost) {
		e.t.Errorf("context.Cause of fn's context after the loss: %v, want an error wrapping fairlock.ErrLost", cause)
	}
	if !errors.Is(do.err, fairlock.ErrLost) {
		e.t.Errorf("Do whose grant was lost returned %v, want an error wrapping fairlock.ErrLost", do.err)
	}
	e.free("TryLock after Do's grant was lost", ls[1], k)
	e.awaitIdle(k)
}

// shared: readers share a key across Lockers, task-fair behind writers.
func shared(e *env) {
	first := e.newLocker()
	if _, ok := first.(keylock.RWLocker); !ok {
		e.t.Skip("New's Locker is not a keylock.RWLocker")
	}
	ls := []keylock.RWLocker{first.(keylock.RWLocker)}
	for range 3 {
		l, ok := e.newLocker().(keylock.RWLocker)
		if !ok {
			e.t.Fatal("New returned an RWLocker once and a plain Locker later")
		}
		ls = append(ls, l)
	}
	k := e.key
	rlock := func(i int) func(context.Context) (keylock.Lease, error) {
		return func(ctx context.Context) (keylock.Lease, error) { return ls[i].RLock(ctx, k) }
	}
	r1 := e.granted(e.goCall("RLock through Locker 0", e.flow(), rlock(0)), k)
	r2 := e.granted(e.goCall("RLock through Locker 1 beside a reader", e.flow(), rlock(1)), k)
	r3, err := ls[2].TryRLock(e.flow(), k)
	r3 = e.wantLease("TryRLock through Locker 2 beside readers", k, r3, err)
	if r1.Token() == r2.Token() || r2.Token() == r3.Token() || r1.Token() == r3.Token() {
		e.t.Errorf("readers' tokens %d, %d, %d: want distinct", r1.Token(), r2.Token(), r3.Token())
	}
	e.wouldBlock("TryLock while readers hold the key", ls[3], k)
	w := e.goCall("Lock through Locker 3 behind readers", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[3].Lock(ctx, k) })
	e.awaitQueue(k, 3, 1, w)
	r4 := e.goCall("RLock through Locker 0 behind the queued writer", e.flow(), rlock(0))
	e.awaitQueue(k, 3, 2, w, r4)
	l, err := ls[1].TryRLock(e.flow(), k)
	e.wantErr("TryRLock with readers holding and a writer queued", l, err, fairlock.ErrWouldBlock)
	e.unlock("the first reader", r1)
	e.unlock("the second reader", r2)
	e.awaitQueue(k, 1, 2, w, r4)
	e.unlock("the third reader", r3)
	lw := e.granted(w, k, r4)
	e.awaitQueue(k, 1, 1, r4)
	r5 := e.goCall("RLock through Locker 1 behind the writer", e.flow(), rlock(1))
	e.awaitQueue(k, 1, 2, r4, r5)
	e.unlock("the writer", lw)
	l4 := e.granted(r4, k)
	l5 := e.granted(r5, k) // readers queued together are granted together
	e.later("a reader after the writer", l4.Token(), lw.Token())
	e.later("a reader after the writer", l5.Token(), lw.Token())

	// A writer that leaves the queue lets the readers behind it in.
	wctx, cancel := context.WithCancel(e.flow())
	defer cancel()
	w = e.goCall("Lock through Locker 2 behind readers, then cancelled", wctx, func(ctx context.Context) (keylock.Lease, error) { return ls[2].Lock(ctx, k) })
	e.awaitQueue(k, 2, 1, w)
	r6 := e.goCall("RLock through Locker 3 behind the writer", e.flow(), rlock(3))
	e.awaitQueue(k, 2, 2, w, r6)
	cancel()
	e.refused(w, context.Canceled)
	l6 := e.granted(r6, k)
	for _, l := range []keylock.Lease{l4, l5, l6} {
		e.unlock("a reader", l)
	}
	e.awaitIdle(k)

	// Reentrancy in shared mode.
	ctx := e.flow()
	r, err := ls[0].RLock(ctx, k)
	r = e.wantLease("RLock", k, r, err)
	l, err = ls[0].RLock(ctx, k)
	e.wantErr("RLock by an owner that holds the key shared", l, err, fairlock.ErrReentrant)
	l, err = ls[0].TryRLock(ctx, k)
	e.wantErr("TryRLock by an owner that holds the key shared", l, err, fairlock.ErrReentrant)
	l, err = ls[0].Lock(ctx, k)
	e.wantErr("Lock (an upgrade) by an owner that holds the key shared", l, err, fairlock.ErrReentrant)
	e.wantErr("Wait by an owner that holds the key shared", nil, ls[0].Wait(ctx, k), fairlock.ErrReentrant)
	e.unlock("the reader", r)
	e.free("TryLock once the readers are gone", ls[1], k)
	e.awaitIdle(k)
}

// semaphore: weights, head-of-line FIFO and units shared across
// Semaphores.
func semaphore(e *env) {
	if e.h.NewSemaphore == nil {
		e.t.Skip("the Harness has no NewSemaphore")
	}
	const n = 3
	ss := []keylock.Semaphore{e.newSemaphore(n), e.newSemaphore(n), e.newSemaphore(n)}
	k := e.key
	acquire := func(i int, w int64) func(context.Context) (keylock.Lease, error) {
		return func(ctx context.Context) (keylock.Lease, error) { return ss[i].Acquire(ctx, k, w) }
	}
	for _, w := range []int64{0, -1, n + 1} {
		l, err := ss[0].Acquire(e.flow(), k, w)
		e.wantErr(fmt.Sprintf("Acquire(%d) of a %d-unit Semaphore", w, n), l, err, fairlock.ErrInvalidWeight)
		l, err = ss[0].TryAcquire(e.flow(), k, w)
		e.wantErr(fmt.Sprintf("TryAcquire(%d) of a %d-unit Semaphore", w, n), l, err, fairlock.ErrInvalidWeight)
	}
	e.awaitIdle(k)

	a := e.granted(e.goCall("Acquire(2) through Semaphore 0", e.flow(), acquire(0, 2)), k)
	b, err := ss[1].TryAcquire(e.flow(), k, 1)
	b = e.wantLease("TryAcquire(1) through Semaphore 1 beside 2 units held", k, b, err)
	l, err := ss[2].TryAcquire(e.flow(), k, 1)
	e.wantErr("TryAcquire(1) through Semaphore 2 with every unit held", l, err, fairlock.ErrWouldBlock)
	e.unlock("the unit of Semaphore 1", b)

	c := e.goCall("Acquire(2) through Semaphore 1, which does not fit", e.flow(), acquire(1, 2))
	e.awaitQueue(k, 1, 1, c)
	d := e.goCall("Acquire(1) through Semaphore 2, which fits but is behind a larger request", e.flow(), acquire(2, 1))
	e.awaitQueue(k, 1, 2, c, d)
	l, err = ss[0].TryAcquire(e.flow(), k, 1)
	e.wantErr("TryAcquire(1) with a free unit and requests queued", l, err, fairlock.ErrWouldBlock)
	e.unlock("the 2 units of Semaphore 0", a)
	lc := e.granted(c, k)
	ld := e.granted(d, k)
	e.later("units granted after a release", lc.Token(), a.Token())
	e.later("units granted after a release", ld.Token(), a.Token())
	l, err = ss[0].TryAcquire(e.flow(), k, 1)
	e.wantErr("TryAcquire(1) with every unit held", l, err, fairlock.ErrWouldBlock)
	e.unlock("the 2 units of Semaphore 1", lc)

	// A head request that leaves the queue lets the smaller ones in.
	cctx, cancel := context.WithCancel(e.flow())
	defer cancel()
	c = e.goCall("Acquire(3) through Semaphore 0, then cancelled", cctx, acquire(0, 3))
	e.awaitQueue(k, 1, 1, c)
	f := e.goCall("Acquire(2) through Semaphore 1, behind it", e.flow(), acquire(1, 2))
	e.awaitQueue(k, 1, 2, c, f)
	cancel()
	e.refused(c, context.Canceled)
	lf := e.granted(f, k)
	e.unlock("the unit of Semaphore 2", ld)
	e.unlock("the 2 units of Semaphore 1", lf)
	e.awaitIdle(k)

	// Reentrancy: an owner that holds units of a key.
	ctx := e.flow()
	u, err := ss[0].Acquire(ctx, k, 1)
	u = e.wantLease("Acquire(1)", k, u, err)
	l, err = ss[0].Acquire(ctx, k, 1)
	e.wantErr("Acquire(1) by an owner that holds units of the key", l, err, fairlock.ErrReentrant)
	l, err = ss[0].TryAcquire(ctx, k, 1)
	e.wantErr("TryAcquire(1) by an owner that holds units of the key", l, err, fairlock.ErrReentrant)
	e.unlock("the unit", u)
	// Every unit is back: a new owner gets all n at once.
	l, err = ss[1].TryAcquire(e.flow(), k, n)
	l = e.wantLease(fmt.Sprintf("TryAcquire(%d) once every unit was released", n), k, l, err)
	e.unlock(fmt.Sprintf("the %d units", n), l)
	e.awaitIdle(k)
}
