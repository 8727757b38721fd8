// Package flight runs one computation per key: concurrent calls for a key
// share one run of a function, in process (Group) and across processes
// over any keylock.Locker and a store the caller provides (Cache).
//
// It is for efficiency, not correctness. A Group or a Cache makes a
// thousand concurrent requests for an expired cache entry cost one
// computation instead of a thousand, and keeps a hot key's refills from
// stampeding the database behind it; it does not make the computation
// exclusive: a fill whose grant was lost (a process paused past its TTL)
// can still be running when the next one starts. What must never run
// twice at once is protected by a lock and fenced with its token
// (keylock.Do, Lease.Token): the tool for correctness.
//
// # In process: Group
//
// Group is golang.org/x/sync/singleflight's Group, generic over key and
// value, with each caller's own context: a caller whose context ends
// returns at once with its context's error, and the function's context
// ends only when every caller waiting on the run has left (Tailscale's
// util/singleflight.DoChanContext does the same); singleflight runs the
// function on its first caller's context, whose cancellation fails every
// caller (moby/moby#44520). A panic or runtime.Goexit in the function
// reaches every caller as a *PanicError carrying the value and the stack.
// singleflight's answer to a panic that left the other callers waiting
// forever (golang/go#33519, golang/go#41133) is to re-panic in every
// caller of Do and, from DoChan, to panic on a goroutine of its own,
// which no caller can recover and which ends the process; a Goexit still
// leaves DoChan's callers waiting forever (golang/go#52557).
//
// # Across processes: Cache
//
// Cache reads a value from a Store; when the value is missing or has
// expired, this process's callers are collapsed into one load (a Group),
// and across processes one load takes the key's lock (TryLock) and fills
// while the others Wait for its release and read what it stored. Its
// fill's context ends if its grant is lost, and it stores the value
// through Store.Set with its Lease, so that a store that can fences the
// write with the grant's token. A fill that fails leaves a short-lived
// error record in the store (WithErrorTTL): the processes that waited on
// it return the error instead of each filling in turn. A filler that dies
// or whose callers all leave stores nothing; the waiters find the key
// still empty and queue for it (Lock), and the first in line fills.
// WithEarlyRefresh refills a value shortly before it expires, by one
// caller, while the others keep reading the old value: probabilistic early
// expiration (Vattani, Chierichetti and Lowenstein, "Optimal Probabilistic
// Cache Stampede Prevention", PVLDB 8(8), 2015: "XFetch").
//
// docs/flight.md sets both beside singleflight and the Redis-polling
// libraries, and says what each promise rests on.
package flight

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/fairlock/fairlock/ctxerr"
)

var (
	// ErrAbandoned is the cause (context.Cause) of a run's context when
	// every caller waiting on the run has left: the function's result
	// would reach no one. Its context's Err is context.Canceled.
	ErrAbandoned = errors.New("flight: every caller of the run has left")
	// ErrGoexit is the Value of the *PanicError that the callers of a
	// run get when the function called runtime.Goexit (t.FailNow in a
	// test, say) instead of returning.
	ErrGoexit = errors.New("flight: the function called runtime.Goexit")
)

// errReturned is the cause of a run's context once the function has
// returned: the context is released then, as context.WithCancel asks.
var errReturned = errors.New("flight: the run has returned")

// PanicError is the error every caller of a run gets when the function
// panicked or called runtime.Goexit: the process goes on, and each caller
// decides what the panic means. It unwraps to Value when Value is an
// error (so errors.Is(err, ErrGoexit) finds a Goexit).
type PanicError struct {
	// Value is the value passed to panic (a *runtime.PanicNilError for
	// panic(nil)), or ErrGoexit.
	Value any
	// Stack is the stack of the goroutine that ran the function, taken
	// (runtime/debug.Stack) while the panic or Goexit unwound it: the
	// function's frames are in it.
	Stack []byte
}

// Error returns "flight: the function panicked: VALUE" (or "flight: the
// function called runtime.Goexit"), a blank line and the stack.
func (e *PanicError) Error() string {
	if e.Value == ErrGoexit {
		return fmt.Sprintf("%v\n\n%s", ErrGoexit, e.Stack)
	}
	return fmt.Sprintf("flight: the function panicked: %v\n\n%s", e.Value, e.Stack)
}

// Unwrap returns Value if it is an error, else nil.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Result is what DoChan delivers: Do's three results.
type Result[V any] struct {
	Val    V
	Err    error
	Shared bool // the run served more than one call (see Do)
}

// Group collapses concurrent calls for one key into one run of a
// function. The zero Group is ready to use; a Group must not be copied
// after its first use. Its methods are safe for concurrent use.
type Group[K comparable, V any] struct {
	mu sync.Mutex     // protects m, and callers and waiting of every call
	m  map[K]*call[V] // the run in flight for each key; a run leaves it when it returns, is forgotten or abandoned
}

// call is one run of a function for a key.
//
// States: running (in the Group's map, done open), then either returned
// (fn returned, panicked or called Goexit: removed from the map if still
// there, its context cancelled, done closed) or, first, detached (removed
// from the map by Forget or when its last caller left, which also cancels
// its context with ErrAbandoned; it goes on running until fn returns, and
// delivers to whoever still waits). A key's map entry is deleted only
// while it is still the call that put it there.
type call[V any] struct {
	ctx    context.Context         // fn's: the first caller's values, no caller's deadline or cancellation
	cancel context.CancelCauseFunc // ends ctx
	done   chan struct{}           // closed once val and err are final

	val V     // written by the run before done is closed
	err error // idem

	callers int // guarded by Group.mu: calls that joined the run, the first included
	waiting int // guarded by Group.mu: calls that joined and have not left early
}

// Do runs fn for key once for all the concurrent calls of key: the first
// call starts a run of fn on a goroutine of its own, and every call made
// while that run is in flight waits for its result instead of starting
// another. It returns fn's value and error, and shared: whether more than
// one call joined the run (some of them may have left before it ended).
// Every caller gets the same V: a pointer, slice or map in it is shared.
//
// Each caller keeps its own context. Do blocks until the run returns or
// ctx ends; a caller whose ctx ends returns at once with a zero V and
// ctx's error (context.Canceled or DeadlineExceeded, wrapping its cause
// if one was set), while the run goes on for the callers that remain.
// fn's context carries the first caller's values, no caller's deadline
// or cancellation, and ends (context.Canceled, cause ErrAbandoned) when
// every caller waiting on the run has left; the run then leaves the
// Group, so that a later call starts a run of its own, even while the
// abandoned fn has not yet returned. A ctx already done fails the call
// before it joins or starts anything. fn's context also ends when fn
// returns.
//
// If fn panics or calls runtime.Goexit, the panic is recovered on the
// run's goroutine and every caller gets a *PanicError with the value and
// the stack: nothing crashes, and Do never panics for fn.
//
// Costs: the first call of a run allocates the run, its context and its
// goroutine; a call that joins allocates nothing. A nil ctx panics.
func (g *Group[K, V]) Do(ctx context.Context, key K, fn func(context.Context) (V, error)) (v V, shared bool, err error) {
	if ctx.Err() != nil {
		return v, false, ctxerr.Of(ctx)
	}
	r := g.wait(ctx, key, g.join(ctx, key, fn))
	return r.Val, r.Shared, r.Err
}

// DoChan is Do that does not block: it returns a channel that receives
// Do's results once, then is never closed or written again. The call has
// joined the key's run (or started it) when DoChan returns. The channel
// is buffered, so a caller that stops listening leaks nothing. Every
// rule of Do holds: a caller whose ctx ends receives its context's error
// at once, and a panic in fn arrives as a *PanicError (x/sync's DoChan
// would panic on a goroutine of its own and end the process).
//
// Costs: Do's, plus the channel and, for a ctx not already done, a
// goroutine that waits for the run or ctx and exits with it.
func (g *Group[K, V]) DoChan(ctx context.Context, key K, fn func(context.Context) (V, error)) <-chan Result[V] {
	ch := make(chan Result[V], 1)
	if ctx.Err() != nil {
		ch <- Result[V]{Err: ctxerr.Of(ctx)}
		return ch
	}
	c := g.join(ctx, key, fn)
	go func() { ch <- g.wait(ctx, key, c) }()
	return ch
}

// Forget makes the next call for key start a run of its own, even if a
// run is in flight: the calls already waiting on that run keep waiting
// for its result, and it keeps its context. Forget of a key with no run
// does nothing. It never blocks beyond the Group's mutex.
func (g *Group[K, V]) Forget(key K) {
	g.mu.Lock()
	delete(g.m, key)
	g.mu.Unlock()
}

// join adds a call to key's run, starting one with fn if none is in
// flight, and returns it.
func (g *Group[K, V]) join(ctx context.Context, key K, fn func(context.Context) (V, error)) *call[V] {
	g.mu.Lock()
	if c, ok := g.m[key]; ok {
		c.callers++
		c.waiting++
		g.mu.Unlock()
		return c
	}
	if g.m == nil {
		g.m = make(map[K]*call[V])
	}
	fctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	c := &call[V]{ctx: fctx, cancel: cancel, done: make(chan struct{}), callers: 1, waiting: 1}
	g.m[key] = c
	g.mu.Unlock()
	go g.run(c, key, fn)
	return c
}

// wait returns c's result, or ctx's error as soon as ctx ends first; a
// caller that leaves early no longer counts as waiting, and the last to
// leave ends the run's context.
func (g *Group[K, V]) wait(ctx context.Context, key K, c *call[V]) Result[V] {
	select {
	case <-c.done:
	case <-ctx.Done():
		select {
		case <-c.done: // both at once: the result is there, take it
		default:
			g.leave(key, c)
			return Result[V]{Err: ctxerr.Of(ctx)}
		}
	}
	// Every join happened before the run took g.mu to finish, and none
	// after: callers is final once done is closed.
	return Result[V]{Val: c.val, Err: c.err, Shared: c.callers > 1}
}

// leave records that a caller of c has left early. The last one detaches
// c from the Group and ends its context.
func (g *Group[K, V]) leave(key K, c *call[V]) {
	g.mu.Lock()
	c.waiting--
	last := c.waiting == 0
	if last && g.m[key] == c {
		delete(g.m, key)
	}
	g.mu.Unlock()
	if last {
		c.cancel(ErrAbandoned)
	}
}

// run is the goroutine of a run: it calls fn, turns a panic or Goexit
// into a *PanicError, removes the run from the Group (if it is still
// key's), releases its context and publishes the result.
func (g *Group[K, V]) run(c *call[V], key K, fn func(context.Context) (V, error)) {
	returned := false
	defer func() {
		if !returned {
			// A panic, or runtime.Goexit, which recover does not stop
			// (it returns nil then: since Go 1.21, panic(nil) panics
			// with a *runtime.PanicNilError instead). Under Goexit the
			// goroutine ends after this function, which is all a
			// Goexit may do here: it is our goroutine.
			r := recover()
			if r == nil {
				r = ErrGoexit
			}
			c.err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		g.mu.Lock()
		if g.m[key] == c {
			delete(g.m, key)
		}
		g.mu.Unlock()
		c.cancel(errReturned)
		close(c.done)
	}()
	c.val, c.err = fn(c.ctx)
	returned = true
}
