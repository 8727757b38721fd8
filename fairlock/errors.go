package fairlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
)

// The sentinel errors. Every error a Locker returns wraps exactly one of
// these or a context's error, so callers test with errors.Is.
var (
	// ErrReentrant: the caller's owner (see package owner) already holds the
	// key. Every call that asks for a key (Lock, RLock, Wait, Acquire,
	// their Try forms, LockMany) returns it at once instead of deadlocking.
	//
	// A grant belongs to the owner of the call that took it, not to
	// whoever holds its Guard. Code that locks a key and hands the Guard to
	// another goroutine to unlock later, a hand-off sync.Mutex allows, gets
	// ErrReentrant from its own next call on the key, where it meant to
	// wait for that goroutine. Say so with Guard.HandOff before handing
	// the Guard over: it moves the grant to the owner that will release
	// it (a flow of the worker's own, from owner.NewContext), and the next
	// call then waits as any other owner's would. docs/guarantees.md
	// (Reentrancy) shows the pattern.
	ErrReentrant = errors.New("fairlock: reentrant lock: the owner already holds the key")
	// ErrWouldBlock: TryLock, TryRLock or TryAcquire found the key held in
	// a way that excludes the call, or with queued waiters.
	ErrWouldBlock = errors.New("fairlock: would block: the key is held or has waiters")
	// ErrClosed: the Locker or Semaphore was closed before the call, or
	// while it waited.
	ErrClosed = errors.New("fairlock: locker closed")
	// ErrDeadlock: with WithDeadlockDetection, waiting would have closed a
	// cycle in the wait-for graph. The error is also a *DeadlockError.
	ErrDeadlock = errors.New("fairlock: deadlock: waiting would close a wait-for cycle")
	// ErrInvalidKey: the key is not equal to itself, because it is or
	// holds a floating-point NaN. No call could ever find such a key again
	// (Go maps treat NaN keys the same way), so its Unlock could not
	// release it; every call refuses it at once instead.
	ErrInvalidKey = errors.New("fairlock: invalid key: not equal to itself (a NaN)")
	// ErrInvalidWeight: Semaphore.Acquire or TryAcquire asked for fewer
	// than 1 unit or more than the Semaphore's n, which no grant could
	// ever satisfy.
	ErrInvalidWeight = errors.New("fairlock: invalid weight: want 1 to the semaphore's units")
	// ErrLost: a grant ended before its holder released it. No in-process
	// Locker or Semaphore loses a grant; the backends across processes
	// (etcdlock, redislock) return it, wrapped in a *LockError with Op
	// "Unlock", from the Unlock of a grant whose lease expired, whose
	// entry someone else deleted, or that could not be renewed for a
	// TTL. Another holder may have held the key since: anything written
	// under the grant must be checked with its fencing token.
	ErrLost = errors.New("fairlock: lock lost: the grant ended before it was released")
)

// LockError is the error every call of a Locker or Semaphore that asks
// for a key returns (Close returns a plain error naming the Locker and
// wrapping ctx's), the error of every call on a key of the backends
// across processes (etcdlock, redislock), and the error of keylock.Do and
// keylock.LockMany. It names the operation, the key and the owner, and
// unwraps to a sentinel (ErrReentrant, ErrWouldBlock, ErrClosed,
// ErrDeadlock, ErrInvalidKey, ErrInvalidWeight, ErrLost), to the
// context's error (context.Canceled, context.DeadlineExceeded, or a cause
// set with context.WithCancelCause) or, from a backend, to the error of
// the engine call that failed.
type LockError struct {
	// Op is the call: "Lock", "TryLock", "RLock", "TryRLock", "Wait",
	// "Acquire", "TryAcquire" or "LockMany"; from etcdlock and redislock
	// also "Unlock" (a lost grant, or a release that failed) and
	// "Locked"; from keylock.Do, "Do" (the cause of fn's context when the
	// grant is lost, or the error when the lock function returned neither
	// a Lease nor an error).
	Op    string
	Key   any      // the key the call was for; nil for LockMany with no keys
	Owner owner.ID // the caller's owner
	Err   error    // the sentinel, context or engine error

	render func(any) string // the Locker's key renderer; nil: renderKey
	detail string           // what the call asked for, when that is the fault
}

// Error returns a message of the form
// `fairlock: Lock "order-7" (flow#3): context deadline exceeded`, the
// owner with its label if it has one (flow#3 "req-42"); for
// ErrInvalidWeight it ends with the weight asked for and the units per
// key: `... (asked for 4; the semaphore has 3 units per key)`. The key
// is rendered as in debug output: string keys quoted, pointer keys as type
// and address (or by the Locker's WithKeyFormatter), control characters
// escaped; a key whose rendering is longer than 256 bytes is cut there
// and followed by its size: `"aaaa"… (2097152 bytes)`.
func (e *LockError) Error() string {
	var b strings.Builder
	b.WriteString("fairlock: ")
	b.WriteString(e.Op)
	b.WriteByte(' ')
	if e.Key == nil && e.Op == "LockMany" { // LockMany's keys are never nil
		b.WriteString("(no keys)")
	} else {
		b.WriteString(keyText(e.Key, e.render)) // a long key cut, with its size
	}
	if e.Owner != 0 {
		b.WriteString(" (")
		b.WriteString(e.Owner.String())
		b.WriteByte(')')
	}
	b.WriteString(": ")
	b.WriteString(strings.TrimPrefix(e.Err.Error(), "fairlock: "))
	if e.detail != "" {
		b.WriteString(" (")
		b.WriteString(e.detail)
		b.WriteByte(')')
	}
	return b.String()
}

// Unwrap returns the sentinel or context error.
func (e *LockError) Unwrap() error { return e.Err }

// LogValue implements slog.LogValuer: a LockError logged as an attribute
// (slog.Any("err", err)) is a group of fields rather than one string:
//
//	op     the call, as Op
//	key    the key rendered as in debug output, a string key without the
//	       quotes of the text forms (JSON quotes it on its own): user-13
//	owner  the owner's name, flow#3 or goroutine#41 (omitted if 0)
//	label  the owner's label (owner.NewLabeledContext), if it has one
//	cause  the error it wraps, without the "fairlock: " prefix: "context
//	       deadline exceeded", "reentrant lock: the owner already holds the key"
//	detail what the call asked for, when that is the fault (ErrInvalidWeight)
//
// It renders the key, running the Locker's WithKeyFormatter if it has one,
// when the handler resolves the value.
func (e *LockError) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs, slog.String("op", e.Op))
	if e.Key != nil || e.Op != "LockMany" {
		attrs = append(attrs, slog.String("key", registry.JSONKey(keyText(e.Key, e.render))))
	}
	if e.Owner != 0 {
		attrs = append(attrs, slog.String("owner", e.Owner.Name()))
		if l := e.Owner.Label(); l != "" {
			attrs = append(attrs, slog.String("label", l))
		}
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("cause", strings.TrimPrefix(e.Err.Error(), "fairlock: ")))
	}
	if e.detail != "" {
		attrs = append(attrs, slog.String("detail", e.detail))
	}
	return slog.GroupValue(attrs...)
}

// ResultOf classifies the error of a call that asks for a key (nil for a
// grant) as an Observer reports it. A call that ended with its context is
// Canceled or DeadlineExceeded whatever the context's cause (a cause such
// as another call's ErrDeadlock, set by errgroup, is not this call's). An
// error that wraps none of the sentinels and no context error is Error:
// the engine of a distributed backend failed. The distributed backends
// classify their calls with it, so that every Locker reports the same
// result for the same error.
func ResultOf(err error) Result {
	err = ctxerr.How(err)
	switch {
	case err == nil:
		return Acquired
	case errors.Is(err, ErrReentrant):
		return Reentrant
	case errors.Is(err, ErrWouldBlock):
		return WouldBlock
	case errors.Is(err, ErrClosed):
		return Closed
	case errors.Is(err, ErrDeadlock):
		return Deadlock
	case errors.Is(err, ErrInvalidKey):
		return InvalidKey
	case errors.Is(err, ErrInvalidWeight):
		return InvalidWeight
	case errors.Is(err, ErrLost):
		return Lost
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Canceled
	default:
		return Error
	}
}

// ownerAttrs appends the attributes naming id under name to args: its
// name ("flow#3") and, if it has one, its label l (as the call recorded
// it) under name+"_label", each a string of its own, so that a JSON log
// carries the label unquoted.
func ownerAttrs(args []any, name string, id owner.ID, l string) []any {
	args = append(args, name, id.Name())
	if l != "" {
		args = append(args, name+"_label", l)
	}
	return args
}

// count writes n with its noun, singular for one: "1 key", "3 keys".
func count[N ~int | ~int64](n N, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}
