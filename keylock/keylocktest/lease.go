package keylocktest

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// The checks of what a holder does with its Lease beyond Unlock:
// Deadline and keylock.Valid, HandOff, and Waits released together.

// deadline: while a grant is held its Deadline is zero (a grant that
// cannot be lost) or ahead, never moving back, and Valid is true; after
// Unlock it is a non-zero instant no later than Unlock's return, and
// Valid is false.
func deadline(e *env) {
	ls := e.lockers(1)
	k := e.key
	a := e.lock("Lock through Locker 0", ls[0], k)
	d := a.Deadline()
	if !d.IsZero() && !time.Now().Before(d) {
		e.t.Fatalf("Deadline of a grant just taken is %v, not ahead of now", d)
	}
	if !keylock.Valid(a) {
		e.t.Fatalf("Valid is false for a grant just taken (Deadline %v)", d)
	}
	for i := range 3 {
		e.free("TryLock of another key", ls[0], k+"/other") // the backend's goroutines get a turn
		if d2 := a.Deadline(); d2.Before(d) || (d.IsZero() != d2.IsZero()) {
			e.t.Fatalf("Deadline moved from %v to %v while the grant was held (look %d)", d, d2, i+2)
		} else {
			d = d2
		}
	}
	e.unlock("the grant", a)
	after := time.Now()
	d = a.Deadline()
	if d.IsZero() || d.After(after) {
		e.t.Fatalf("Deadline after Unlock is %v; want a non-zero instant no later than Unlock's return (%v)", d, after)
	}
	if keylock.Valid(a) {
		e.t.Fatal("Valid is true after Unlock")
	}
	if keylock.Valid(nil) {
		e.t.Fatal("Valid(nil) is true")
	}
	e.awaitIdle(k)
}

// handOff: HandOff moves a grant to another flow of the same Locker: the
// old owner's next Lock waits instead of failing with ErrReentrant, the
// new owner's fails with it; owner 0, an owner queued on the key, and a
// released grant are refused, changing nothing.
func handOff(e *env) {
	ls := e.lockers(2)
	k := e.key
	oldCtx := e.flow()
	a, err := ls[0].Lock(oldCtx, k)
	a = e.wantLease("Lock through Locker 0", k, a, err)
	if a.HandOff(0) {
		e.t.Fatal("HandOff(0) returned true")
	}

	// An owner queued on the key would wait for itself: refused.
	qctx, cancelQ := context.WithCancel(e.flow())
	q := e.goCall("Lock through Locker 0 by another flow", qctx, func(ctx context.Context) (keylock.Lease, error) { return ls[0].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, q)
	if a.HandOff(owner.Of(qctx)) {
		e.t.Fatal("HandOff to an owner queued on the key returned true")
	}
	cancelQ()
	e.refused(q, context.Canceled)
	e.awaitQueue(k, 1, 0)
	if l, err := ls[0].Lock(oldCtx, k); !errors.Is(err, fairlock.ErrReentrant) {
		e.track(l)
		e.t.Fatalf("Lock by the holder after refused HandOffs: %v, want ErrReentrant: nothing changed", err)
	}

	newCtx := e.flow()
	if !a.HandOff(owner.Of(newCtx)) {
		e.t.Fatal("HandOff to a new flow returned false")
	}
	// The old owner's Lock now waits for the grant, as any owner's.
	b := e.goCall("Lock by the old owner after HandOff", oldCtx, func(ctx context.Context) (keylock.Lease, error) { return ls[0].Lock(ctx, k) })
	e.awaitQueue(k, 1, 1, b)
	// The new owner holds the key: ErrReentrant at once, on every call.
	l, err := ls[0].TryLock(newCtx, k)
	e.wantErr("TryLock by the new owner", l, err, fairlock.ErrReentrant)
	if err := ls[0].Wait(newCtx, k); !errors.Is(err, fairlock.ErrReentrant) {
		e.t.Fatalf("Wait by the new owner: %v, want ErrReentrant", err)
	}
	e.unlock("the handed-off grant", a)
	lb := e.granted(b, k)
	if a.HandOff(owner.Of(e.flow())) {
		e.t.Fatal("HandOff of a released grant returned true")
	}
	e.unlock("the old owner's new grant", lb)
	e.awaitIdle(k)
}

// waitsTogether: one release frees every Wait queued directly behind it
// and the Lock queued behind them, whatever Lockers they came through.
func waitsTogether(e *env) {
	const n = 5
	ls := e.lockers(3)
	k := e.key
	h := e.lock("the holder, through Locker 0", ls[0], k)
	waits := make([]*call, n)
	for i := range waits {
		waits[i] = e.goWait("Wait", e.flow(), ls[i%len(ls)], k)
		e.awaitQueue(k, 1, i+1, waits[:i+1]...)
	}
	c := e.goCall("Lock behind the Waits", e.flow(), func(ctx context.Context) (keylock.Lease, error) { return ls[1].Lock(ctx, k) })
	e.awaitQueue(k, 1, n+1, append(waits, c)...)
	e.unlock("the holder", h)
	for _, w := range waits {
		e.await(w)
		if w.err != nil {
			e.t.Fatalf("Wait: %v, want nil once the holder released", w.err)
		}
	}
	lc := e.granted(c, k)
	// The Waits' entries go once they returned; the Lock holds alone.
	e.awaitQueue(k, 1, 0)
	e.unlock("the Lock behind the Waits", lc)
	e.awaitIdle(k)
}
