package fairlock

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/owner"
)

// MultiGuard holds the locks taken by one LockMany call. It is a value;
// copies are the same grants. The zero MultiGuard holds nothing.
type MultiGuard[K comparable] struct {
	guards []Guard[K] // in the order taken (sorted by key)
}

// Unlock releases every key, in the reverse of the order LockMany took
// them. Like Guard.Unlock it is idempotent: a second Unlock (of a copy too)
// does nothing to keys granted to someone else since.
func (m MultiGuard[K]) Unlock() {
	for i := len(m.guards) - 1; i >= 0; i-- {
		m.guards[i].Unlock()
	}
}

// Keys returns the locked keys in the order they were taken: sorted, with
// duplicates removed. The slice is a copy; it is nil for the zero
// MultiGuard (LockMany of no keys).
func (m MultiGuard[K]) Keys() []K {
	if len(m.guards) == 0 {
		return nil
	}
	keys := make([]K, len(m.guards))
	for i, g := range m.guards {
		keys[i] = g.key
	}
	return keys
}

// LockMany locks every key in keys exclusively for the owner of ctx, all
// or nothing.
// Duplicate keys are locked once. Keys are taken one at a time in
// ascending order, each with Lock, so that any two LockMany calls on the
// same Locker can never deadlock each other: the classic resource-ordering
// rule (Havender, 1968). Each key is waited for in FIFO order as with Lock.
//
// If any Lock fails (the context ends, a key is held by the same owner, the
// Locker closes, or deadlock detection refuses a cycle against plain Lock
// callers), every key already taken is released, in reverse order, before
// LockMany returns the error. The error is a *LockError with Op "LockMany"
// naming the key that failed, and it wraps the same sentinel or context
// error Lock returned. LockMany allocates the sorted key slice and the
// MultiGuard's slice of guards. A nil ctx panics, as in Lock.
//
// With no keys LockMany takes nothing, but it still fails where every Lock
// would: on a done ctx (the context's error) and on a closed Locker
// (ErrClosed), with a *LockError whose Key is nil. A caller whose key list
// comes out empty thus never goes on under a cancelled context as if it
// had been granted. This follows x/sync's semaphore, whose Acquire of 0
// fails on a done context.
func LockMany[K cmp.Ordered](ctx context.Context, l *Locker[K], keys ...K) (MultiGuard[K], error) {
	mustContext(ctx, "LockMany")
	if len(keys) == 0 {
		return MultiGuard[K]{}, l.lockNone(ctx)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	m := MultiGuard[K]{guards: make([]Guard[K], 0, len(sorted))}
	for _, k := range sorted {
		g, err := l.Lock(ctx, k)
		if err != nil {
			m.Unlock()
			var le *LockError
			if errors.As(err, &le) {
				le.Op = "LockMany"
			}
			return MultiGuard[K]{}, err
		}
		m.guards = append(m.guards, g)
	}
	return m, nil
}

// lockNone is LockMany with no keys: nil, or the error each Lock would
// return at once.
func (l *Locker[K]) lockNone(ctx context.Context) error {
	var err error
	if ctx.Err() != nil {
		err = ctxerr.Of(ctx)
	} else if l.t.closing.Load() {
		err = ErrClosed
	} else {
		return nil
	}
	return &LockError{Op: "LockMany", Owner: owner.Of(ctx), Err: err, render: l.t.renderAny}
}
