package keylock_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
)

// fakeLease is a Lease whose Unlock records its calls and returns err
// the first time; Lost is lost.
type fakeLease struct {
	key  string
	err  error
	lost chan struct{}
	log  *callLog

	mu       sync.Mutex
	unlocked bool
	ctx      context.Context // the first Unlock's
	ctxErr   error           // its Err at the call
}

func (l *fakeLease) Unlock(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unlocked {
		return nil
	}
	l.unlocked, l.ctx, l.ctxErr = true, ctx, ctx.Err()
	if l.log != nil {
		l.log.add("Unlock " + l.key)
	}
	return l.err
}

func (l *fakeLease) Key() string           { return l.key }
func (l *fakeLease) Token() uint64         { return 1 }
func (l *fakeLease) Lost() <-chan struct{} { return l.lost }
func (l *fakeLease) Deadline() time.Time   { return time.Time{} }
func (l *fakeLease) HandOff(owner.ID) bool { return false }

func (l *fakeLease) wasUnlocked() (bool, context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unlocked, l.ctx, l.ctxErr
}

// callLog records calls in order.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (c *callLog) add(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
}

func (c *callLog) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// fakeLocker grants every key but those in fail, logging its calls.
type fakeLocker struct {
	log       *callLog
	fail      map[string]error
	unlockErr map[string]error
	leases    []*fakeLease
}

func (f *fakeLocker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	f.log.add("Lock " + key)
	if err := f.fail[key]; err != nil {
		return nil, err
	}
	l := &fakeLease{key: key, log: f.log, err: f.unlockErr[key]}
	f.leases = append(f.leases, l)
	return l, nil
}

func (f *fakeLocker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return f.Lock(ctx, key)
}
func (f *fakeLocker) Wait(context.Context, string) error { return nil }
func (f *fakeLocker) Close(context.Context) error        { return nil }

// bounded fails unless ctx, given to a cleanup Unlock, was not done when
// used although the caller's was, and has a deadline a few seconds away.
func bounded(t *testing.T, what string, ctx context.Context, ctxErr error, start time.Time) {
	t.Helper()
	if ctx == nil {
		t.Errorf("%s: not unlocked", what)
		return
	}
	if ctxErr != nil {
		t.Errorf("%s: Unlock's context was done (%v), want one the caller's cancellation does not reach", what, ctxErr)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		t.Errorf("%s: Unlock's context has no deadline: an unreachable engine could hold it forever", what)
	} else if d := deadline.Sub(start); d <= 0 || d > 10*time.Second {
		t.Errorf("%s: Unlock's context ends %v after the call, want a few seconds", what, d)
	}
}

type ctxKey struct{}

// newLocker returns a Locker that is closed when the test ends, failing
// the test if a key is still held then (instead of waiting for it).
func newLocker(t *testing.T) *fairlock.Locker[string] {
	l := fairlock.New[string]()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func TestLeasesUnlock(t *testing.T) {
	log := &callLog{}
	errB, errD := errors.New("b failed"), errors.New("d failed")
	a, b := &fakeLease{key: "a", log: log}, &fakeLease{key: "b", log: log, err: errB}
	c, d := &fakeLease{key: "c", log: log}, &fakeLease{key: "d", log: log, err: errD}
	ls := keylock.Leases{a, b, nil, c, d}
	err := ls.Unlock(context.Background())
	if !errors.Is(err, errB) || !errors.Is(err, errD) {
		t.Errorf("Unlock: %v, want both failures joined", err)
	}
	if diff := cmp.Diff([]string{"Unlock d", "Unlock c", "Unlock b", "Unlock a"}, log.get()); diff != "" {
		t.Errorf("Unlock order (-want +got):\n%s", diff)
	}
	if err := ls.Unlock(context.Background()); err != nil {
		t.Errorf("a second Unlock: %v, want nil", err)
	}
	// One failure comes back as it is.
	if err := (keylock.Leases{&fakeLease{key: "x", err: errB}}).Unlock(context.Background()); err != errB {
		t.Errorf("Unlock with one failure: %v, want it as it is", err)
	}
	if err := keylock.Leases(nil).Unlock(context.Background()); err != nil {
		t.Errorf("nil Leases' Unlock: %v", err)
	}
}

func TestInProcessViews(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t)
	v1, v2 := keylock.InProcess(l), keylock.InProcess(l)
	lease, err := v1.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Locked("k") {
		t.Error("a grant through the view is not seen by the Locker's Locked")
	}
	other := owner.NewContext(ctx)
	if got, err := v2.TryLock(other, "k"); got != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Errorf("TryLock through a second view: (%v, %v), want a nil Lease and ErrWouldBlock", got, err)
	}
	if _, err := l.TryLock(other, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Errorf("the Locker's own TryLock: %v, want ErrWouldBlock", err)
	}
	got, err := v1.Lock(ctx, "k")
	var le *fairlock.LockError
	if got != nil || !errors.Is(err, fairlock.ErrReentrant) || !errors.As(err, &le) || le.Op != "Lock" {
		t.Errorf("a reentrant Lock through the view: (%#v, %v), want a nil Lease and the Locker's *LockError", got, err)
	}
	if lease.Key() != "k" || lease.Lost() != nil || lease.Token() == 0 {
		t.Errorf("Lease: key %q, Lost %v, token %d", lease.Key(), lease.Lost(), lease.Token())
	}
	if err := lease.Unlock(ctx); err != nil || l.Locked("k") {
		t.Errorf("Unlock: %v; Locked after: %v", err, l.Locked("k"))
	}
	if err := lease.Unlock(ctx); err != nil {
		t.Errorf("a second Unlock: %v", err)
	}
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if g.Token() <= lease.Token() {
		t.Errorf("the Locker's next token %d is not above the view's grant's %d: not one token sequence", g.Token(), lease.Token())
	}
	_ = lease.Unlock(ctx) // stale: must not release g
	if !l.Locked("k") {
		t.Error("a stale Unlock through the view released the Locker's later grant")
	}
	g.Unlock()

	// Shared holds and the semaphore.
	rw := keylock.InProcess(l)
	r1, err1 := rw.RLock(ctx, "r")
	r2, err2 := rw.TryRLock(other, "r")
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if w, err := rw.TryLock(owner.NewContext(ctx), "r"); w != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Errorf("TryLock beside readers: (%v, %v)", w, err)
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	s := fairlock.NewSemaphore[string](2)
	defer s.Close(ctx)
	sv := keylock.InProcessSemaphore(s)
	if u, err := sv.Acquire(ctx, "s", 3); u != nil || !errors.Is(err, fairlock.ErrInvalidWeight) {
		t.Errorf("Acquire(3) of 2 units: (%v, %v), want a nil Lease and ErrInvalidWeight", u, err)
	}
	u, err := sv.Acquire(ctx, "s", 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(other, "s", 1); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Errorf("the Semaphore's own TryAcquire beside the view's grant: %v", err)
	}
	u.Unlock(ctx)
	if err := sv.Close(ctx); err != nil {
		t.Errorf("Close through the view: %v", err)
	}
	if _, err := s.Acquire(ctx, "s", 1); !errors.Is(err, fairlock.ErrClosed) {
		t.Errorf("the Semaphore after Close through its view: %v, want ErrClosed", err)
	}
}

func TestInProcessOfNilPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"InProcess":          func() { keylock.InProcess(nil) },
		"InProcessSemaphore": func() { keylock.InProcessSemaphore(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(nil) did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestDo(t *testing.T) {
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	l := newLocker(t)
	v := keylock.InProcess(l)
	errFn := errors.New("fn failed")
	err := keylock.Do(ctx, v.Lock, "k", func(fctx context.Context, _ keylock.Lease) error {
		if fctx != ctx {
			t.Error("fn's context is not ctx itself, with a Lease that cannot be lost")
		}
		if !l.Locked("k") {
			t.Error("fn runs without the key held")
		}
		return errFn
	})
	if err != errFn {
		t.Errorf("Do: %v, want fn's error as it is", err)
	}
	if l.Locked("k") {
		t.Error("the key is held after Do")
	}
	if err := keylock.Do(ctx, v.RLock, "k", func(context.Context, keylock.Lease) error { return nil }); err != nil {
		t.Errorf("Do with RLock: %v", err)
	}

	// A failed lock: fn does not run and the error comes back unchanged.
	g, _ := l.Lock(ctx, "k")
	var lockErr error
	tryLock := func(ctx context.Context, key string) (keylock.Lease, error) {
		ls, err := v.TryLock(owner.NewContext(ctx), key)
		lockErr = err
		return ls, err
	}
	err = keylock.Do(ctx, tryLock, "k", func(context.Context, keylock.Lease) error {
		t.Error("fn ran although the lock failed")
		return nil
	})
	if err == nil || err != lockErr {
		t.Errorf("Do with a failing lock: %v, want the lock's error as it is (%v)", err, lockErr)
	}
	g.Unlock()

	// A lock function that breaks the contract.
	nilLock := func(context.Context, string) (keylock.Lease, error) { return nil, nil }
	var le *fairlock.LockError
	err = keylock.Do(ctx, nilLock, "k", func(context.Context, keylock.Lease) error {
		t.Error("fn ran without a Lease")
		return nil
	})
	if !errors.As(err, &le) || le.Op != "Do" || le.Key != any("k") {
		t.Errorf("Do with a lock returning (nil, nil): %v, want a *LockError with Op Do", err)
	}
}

// TestDoUnlocksDetached: Do unlocks on a context that fn's cancellation
// does not reach, that keeps ctx's values and is bounded, and joins
// Unlock's error to fn's.
func TestDoUnlocksDetached(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	defer cancel()
	errUnlock, errFn := errors.New("unlock failed"), errors.New("fn failed")
	lease := &fakeLease{key: "k", err: errUnlock}
	lock := func(context.Context, string) (keylock.Lease, error) { return lease, nil }
	start := time.Now()
	err := keylock.Do(ctx, lock, "k", func(context.Context, keylock.Lease) error {
		cancel() // fn's work ended with the caller's context
		return errFn
	})
	if !errors.Is(err, errFn) || !errors.Is(err, errUnlock) {
		t.Errorf("Do: %v, want fn's error joined with Unlock's", err)
	}
	done, uctx, uerr := lease.wasUnlocked()
	if !done {
		t.Fatal("Do did not unlock")
	}
	bounded(t, "Do", uctx, uerr, start)
	if uctx.Value(ctxKey{}) != "v" {
		t.Error("Unlock's context lost ctx's values")
	}
	// Unlock's error alone comes back as it is.
	lease = &fakeLease{key: "k", err: errUnlock}
	if err := keylock.Do(context.Background(), lock, "k", func(context.Context, keylock.Lease) error { return nil }); err != errUnlock {
		t.Errorf("Do whose Unlock failed: %v, want Unlock's error as it is", err)
	}
}

// TestDoPanic: a panicking fn is unlocked and the panic goes on with
// the same value; so does runtime.Goexit (t.FailNow in fn).
func TestDoPanic(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t)
	v := keylock.InProcess(l)
	value := errors.New("the panic value")
	func() {
		defer func() {
			if r := recover(); r != value {
				t.Errorf("recovered %v, want fn's panic value", r)
			}
		}()
		_ = keylock.Do(ctx, v.Lock, "k", func(context.Context, keylock.Lease) error { panic(value) })
	}()
	if l.Locked("k") {
		t.Fatal("the key is held after fn panicked")
	}

	// A Lease that can be lost: its watcher stops and Unlock is bounded.
	lease := &fakeLease{key: "k", lost: make(chan struct{})}
	lock := func(context.Context, string) (keylock.Lease, error) { return lease, nil }
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != value {
				t.Errorf("recovered %v, want fn's panic value", r)
			}
		}()
		_ = keylock.Do(ctx, lock, "k", func(context.Context, keylock.Lease) error { panic(value) })
	}()
	done, uctx, uerr := lease.wasUnlocked()
	if !done {
		t.Fatal("Do did not unlock after fn panicked")
	}
	bounded(t, "Do after a panic", uctx, uerr, start)

	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = keylock.Do(ctx, v.Lock, "k", func(context.Context, keylock.Lease) error {
			runtime.Goexit()
			return nil
		})
	}()
	<-exited
	if l.Locked("k") {
		t.Error("the key is held after fn called runtime.Goexit")
	}
}

// TestDoCancelsFnOnLoss: fn's context ends when the Lease's Lost closes,
// with a cause that wraps ErrLost, and Do returns Unlock's ErrLost.
func TestDoCancelsFnOnLoss(t *testing.T) {
	lostErr := &fairlock.LockError{Op: "Unlock", Key: "k", Err: fairlock.ErrLost}
	lease := &fakeLease{key: "k", lost: make(chan struct{}), err: lostErr}
	lock := func(context.Context, string) (keylock.Lease, error) { return lease, nil }
	ctx := owner.NewContext(context.Background())
	id := owner.Of(ctx)
	running := make(chan struct{})
	var cause error
	done := make(chan error)
	go func() {
		done <- keylock.Do(ctx, lock, "k", func(fctx context.Context, _ keylock.Lease) error {
			close(running)
			<-fctx.Done()
			cause = context.Cause(fctx)
			return fctx.Err()
		})
	}()
	select {
	case <-running:
	case err := <-done:
		t.Fatalf("Do returned (%v) before fn ran", err)
	}
	close(lease.lost)
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		// fn waits for its context, which the loss did not end; Do's
		// goroutine is left behind (goleak reports it too).
		t.Fatal("fn's context did not end within 30 s of the loss")
	}
	var le *fairlock.LockError
	if !errors.Is(cause, fairlock.ErrLost) || !errors.As(cause, &le) || le.Op != "Do" || le.Key != any("k") || le.Owner != id {
		t.Errorf("fn's context's cause: %v, want a *LockError (Do, %q, %v) wrapping ErrLost", cause, "k", id)
	}
	if !errors.Is(err, fairlock.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do: %v, want fn's error joined with Unlock's ErrLost", err)
	}
	if ok, _, _ := lease.wasUnlocked(); !ok {
		t.Error("Do did not unlock a lost Lease")
	}

	// Lost before fn starts: fn's context is done from the start.
	lease = &fakeLease{key: "k", lost: make(chan struct{}), err: lostErr}
	close(lease.lost)
	err = keylock.Do(ctx, lock, "k", func(fctx context.Context, _ keylock.Lease) error {
		if !errors.Is(context.Cause(fctx), fairlock.ErrLost) {
			t.Errorf("fn of a grant lost already: cause %v", context.Cause(fctx))
		}
		return nil
	})
	if err != lostErr {
		t.Errorf("Do: %v, want Unlock's ErrLost as it is", err)
	}

	// Lost as fn returns, before Do unlocks: fn succeeded, but the grant
	// ended before its release, so Do reports the loss (Unlock's error).
	lease = &fakeLease{key: "k", lost: make(chan struct{}), err: lostErr}
	err = keylock.Do(ctx, lock, "k", func(context.Context, keylock.Lease) error {
		close(lease.lost)
		return nil
	})
	if err != lostErr {
		t.Errorf("Do whose grant was lost as fn returned: %v, want Unlock's ErrLost as it is", err)
	}

	// Not lost: fn's context lives while fn runs and the watcher is gone
	// after (goleak in TestMain).
	lease = &fakeLease{key: "k", lost: make(chan struct{})}
	err = keylock.Do(ctx, lock, "k", func(fctx context.Context, _ keylock.Lease) error { return fctx.Err() })
	if err != nil {
		t.Errorf("Do with a Lease not lost: %v", err)
	}
}

func TestLockMany(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t)
	v := keylock.InProcess(l)
	ls, err := keylock.LockMany(ctx, v, "c", "a", "b", "a")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, lease := range ls {
		keys = append(keys, lease.Key())
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, keys); diff != "" {
		t.Errorf("LockMany's Leases (-want +got):\n%s", diff)
	}
	if l.Len() != 3 {
		t.Errorf("%d keys held, want 3", l.Len())
	}
	if err := ls.Unlock(ctx); err != nil || l.Len() != 0 {
		t.Errorf("Unlock: %v; %d keys left", err, l.Len())
	}

	// No keys.
	if ls, err := keylock.LockMany(ctx, v); ls != nil || err != nil {
		t.Errorf("LockMany of no keys: (%v, %v), want (nil, nil)", ls, err)
	}
	sentinel := errors.New("the cause")
	done, cancel := context.WithCancelCause(ctx)
	cancel(sentinel)
	ls, err = keylock.LockMany(done, v)
	var le *fairlock.LockError
	if ls != nil || !errors.As(err, &le) || le.Op != "LockMany" || le.Key != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, sentinel) {
		t.Errorf("LockMany of no keys on a done ctx: (%v, %v), want a *LockError with Op LockMany and no key wrapping the context's error and cause", ls, err)
	}

	// A key held by the same owner: the backend's *LockError, now Op
	// LockMany; the keys taken are released.
	g, _ := l.Lock(ctx, "b")
	ls, err = keylock.LockMany(ctx, v, "a", "b", "c")
	if ls != nil || !errors.As(err, &le) || le.Op != "LockMany" || le.Key != any("b") || !errors.Is(err, fairlock.ErrReentrant) {
		t.Errorf("LockMany with a key the owner holds: (%v, %v), want a *LockError LockMany \"b\" wrapping ErrReentrant", ls, err)
	}
	if l.Locked("a") || l.Len() != 1 {
		t.Errorf("LockMany failed but left keys held: %d", l.Len())
	}
	g.Unlock()
}

// TestLockManyReleasesInReverse: on a failure the keys taken are
// released in reverse, on a detached and bounded context, and the error
// names the key and wraps the cause and the release's failures.
func TestLockManyReleasesInReverse(t *testing.T) {
	log := &callLog{}
	errDown, errUnlock := errors.New("engine unreachable"), errors.New("unlock failed")
	f := &fakeLocker{log: log, fail: map[string]error{"c": errDown}, unlockErr: map[string]error{"a": errUnlock}}
	ctx, cancel := context.WithCancel(context.Background())
	f.fail["c"] = errDown
	cancelling := &cancelOnFail{fakeLocker: f, cancel: cancel}
	start := time.Now()
	ls, err := keylock.LockMany(ctx, cancelling, "d", "b", "a", "c")
	var le *fairlock.LockError
	if ls != nil || !errors.As(err, &le) || le.Op != "LockMany" || le.Key != any("c") || !errors.Is(err, errDown) || !errors.Is(err, errUnlock) {
		t.Errorf("LockMany: (%v, %v), want a *LockError LockMany \"c\" wrapping the cause and the failed release", ls, err)
	}
	want := []string{"Lock a", "Lock b", "Lock c", "Unlock b", "Unlock a"}
	if diff := cmp.Diff(want, log.get()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	for _, lease := range f.leases {
		_, uctx, uerr := lease.wasUnlocked()
		bounded(t, "LockMany's release of "+lease.key, uctx, uerr, start)
	}

	// A backend's *LockError is copied, not changed.
	orig := &fairlock.LockError{Op: "Lock", Key: "c", Err: fairlock.ErrClosed}
	f = &fakeLocker{log: &callLog{}, fail: map[string]error{"c": orig}}
	_, err = keylock.LockMany(context.Background(), f, "c")
	if !errors.As(err, &le) || le.Op != "LockMany" || orig.Op != "Lock" || !errors.Is(err, fairlock.ErrClosed) {
		t.Errorf("LockMany: %v (the backend's error now has Op %q), want a copy with Op LockMany", err, orig.Op)
	}
}

// cancelOnFail cancels the caller's context when a Lock fails, as a
// caller whose deadline ended the Lock would see it.
type cancelOnFail struct {
	*fakeLocker
	cancel context.CancelFunc
}

func (c *cancelOnFail) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	l, err := c.fakeLocker.Lock(ctx, key)
	if err != nil {
		c.cancel()
	}
	return l, err
}
