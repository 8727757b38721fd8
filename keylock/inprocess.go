package keylock

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// InProcess returns l as an RWLocker: a view of l itself, not a copy or a
// second lock. A grant taken through the view is a grant of l, seen by
// l's own methods (Locked, Waiters, its Lock and TryLock) and by every
// other view of l, and l's rules hold unchanged: strict FIFO per key,
// Try forms that never overtake, ErrReentrant per owner (owner.Of(ctx)),
// tokens from Guard.Token.
//
// The Leases it returns are fairlock.Guards behind the interface: their
// Unlock is Guard.Unlock (idempotent, any goroutine) and returns nil,
// whatever its context; Token is the Guard's token; Lost is nil, since an
// in-process grant is never lost. A call that fails returns a nil Lease
// and l's error, unchanged (a *fairlock.LockError). Wait and Close are l's.
//
// The view allocates nothing itself (it is one pointer). A granted Lock,
// TryLock, RLock or TryRLock allocates what l's call does (nothing, when
// uncontended) plus the Lease: one object, the copy of the Guard that
// the interface value must point to (TestInProcessAllocatesOnlyTheLease).
// InProcess panics if l is nil.
func InProcess(l *fairlock.Locker[string]) RWLocker {
	if l == nil {
		panic("fairlock: keylock.InProcess of a nil Locker")
	}
	return inProcess{l}
}

// InProcessSemaphore returns s as a Semaphore: a view of s itself, as
// InProcess is of a Locker. Its Leases are s's Guards behind the
// interface (Unlock returns nil, Lost is nil); a failed call returns a
// nil Lease and s's error (fairlock.ErrInvalidWeight for w < 1 or w > n,
// at once). A granted Acquire or TryAcquire allocates the Lease, one
// object. It panics if s is nil.
func InProcessSemaphore(s *fairlock.Semaphore[string]) Semaphore {
	if s == nil {
		panic("fairlock: keylock.InProcessSemaphore of a nil Semaphore")
	}
	return inProcessSemaphore{s}
}

var (
	_ Lister = inProcess{}
	_ Lister = inProcessSemaphore{}
)

// inProcess is the view InProcess returns. One pointer, so that the
// interface value holds it without an allocation.
type inProcess struct{ l *fairlock.Locker[string] }

func (v inProcess) Lock(ctx context.Context, key string) (Lease, error) {
	return leaseOf(v.l.Lock(ctx, key))
}

func (v inProcess) TryLock(ctx context.Context, key string) (Lease, error) {
	return leaseOf(v.l.TryLock(ctx, key))
}

func (v inProcess) RLock(ctx context.Context, key string) (Lease, error) {
	return leaseOf(v.l.RLock(ctx, key))
}

func (v inProcess) TryRLock(ctx context.Context, key string) (Lease, error) {
	return leaseOf(v.l.TryRLock(ctx, key))
}

func (v inProcess) Wait(ctx context.Context, key string) error { return v.l.Wait(ctx, key) }

func (v inProcess) Close(ctx context.Context) error { return v.l.Close(ctx) }

// Calls lists key's calls through fairlock's Locker.Calls (see Lister for
// what it records); it fails only if ctx is done.
func (v inProcess) Calls(ctx context.Context, key string) ([]CallInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, &fairlock.LockError{Op: "Calls", Key: key, Owner: owner.Of(ctx), Err: ctxerr.Of(ctx)}
	}
	return callInfos(v.l.Calls(key), v.l.Name()), nil
}

// inProcessSemaphore is the view InProcessSemaphore returns.
type inProcessSemaphore struct{ s *fairlock.Semaphore[string] }

func (v inProcessSemaphore) Acquire(ctx context.Context, key string, w int64) (Lease, error) {
	return leaseOf(v.s.Acquire(ctx, key, w))
}

func (v inProcessSemaphore) TryAcquire(ctx context.Context, key string, w int64) (Lease, error) {
	return leaseOf(v.s.TryAcquire(ctx, key, w))
}

func (v inProcessSemaphore) Close(ctx context.Context) error { return v.s.Close(ctx) }

// Calls lists key's calls through fairlock's Semaphore.Calls, as the
// Locker's view does.
func (v inProcessSemaphore) Calls(ctx context.Context, key string) ([]CallInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, &fairlock.LockError{Op: "Calls", Key: key, Owner: owner.Of(ctx), Err: ctxerr.Of(ctx)}
	}
	return callInfos(v.s.Calls(key), v.s.Name()), nil
}

// callInfos turns fairlock's record of a key's calls into a listing for
// a Locker named name in this process.
func callInfos(kcs []fairlock.KeyCall, name string) []CallInfo {
	if len(kcs) == 0 {
		return nil
	}
	p := LocalProcess(name)
	now := time.Now()
	out := make([]CallInfo, len(kcs))
	for i, kc := range kcs {
		out[i] = CallInfo{Label: kc.Label, Process: p, Mode: kc.Mode, Units: kc.Units, Held: kc.Held, Token: kc.Token}
		if !kc.Since.IsZero() {
			out[i].Age = max(now.Sub(kc.Since), 0)
		}
	}
	return out
}

// leaseOf turns a call's result into the interface's: the Guard as a
// Lease, or a nil interface (never a typed nil inside one) and the error.
func leaseOf(g fairlock.Guard[string], err error) (Lease, error) {
	if err != nil {
		return nil, err
	}
	return &guardLease{g: g}, nil
}

// guardLease is a Guard as a Lease: the one object a grant through a view
// allocates. Copies of the interface value share it, and Guard.Unlock
// makes each Unlock after the first a no-op.
type guardLease struct {
	g     fairlock.Guard[string]
	ended atomic.Int64 // when the first Unlock began, in ns on this process's monotonic clock (since start); 0 while held
}

// start anchors the monotonic instants guardLease stores as ints.
var start = time.Now()

// Unlock releases the grant (Guard.Unlock) and returns nil; ctx is not
// used: the release never waits beyond a shard mutex.
func (l *guardLease) Unlock(context.Context) error {
	l.ended.CompareAndSwap(0, max(int64(time.Since(start)), 1))
	l.g.Unlock()
	return nil
}

func (l *guardLease) Key() string { return l.g.Key() }

func (l *guardLease) Token() uint64 { return l.g.Token() }

// Lost returns nil: an in-process grant lasts until it is unlocked.
func (*guardLease) Lost() <-chan struct{} { return nil }

// Deadline returns the zero Time while the grant is held (it cannot be
// lost), and the instant its first Unlock began after.
func (l *guardLease) Deadline() time.Time {
	if e := l.ended.Load(); e != 0 {
		return start.Add(time.Duration(e))
	}
	return time.Time{}
}

// HandOff is Guard.HandOff; it refuses once the Lease was unlocked.
func (l *guardLease) HandOff(to owner.ID) bool {
	if l.ended.Load() != 0 {
		return false
	}
	return l.g.HandOff(to)
}
