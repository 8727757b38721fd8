package proccmp

import (
	"context"
	"errors"
)

// Engine names one engine's comparison: what its errors, its workers and
// its table call it. An engine package keeps one, for Start, RunWorker
// and IsWorker.
type Engine struct {
	Name    string   // the engine's package, the prefix of its errors: "rediscmp"
	Program string   // the command that prints its table, named in the header: "redis-compare"
	Env     string   // the environment variable that marks a worker process and carries its spec
	Names   []string // the locks, the table's columns, an index an implementation; the first is fairlock's, the base of the ratios
}

// IsWorker reports whether this process was started as a worker of e's
// comparison; the program's main (or TestMain) then calls RunWorker and
// exits with its result.
func (e *Engine) IsWorker() bool { return IsWorker(e.Env) }

// Locks is one process's instance of each lock of a comparison, on its
// own connection to the server: the parent's, and each worker's. Its
// methods are called from many goroutines at once.
type Locks interface {
	// Lock locks key with lock impl (an index into Engine.Names), waiting
	// at most Config.Bound and no longer than ctx, and returns the
	// function that unlocks it. A call that gave up waiting returns an
	// error that wraps ErrNotGranted. onWait, if not nil, is called once
	// if the call found the key taken and is going to wait, by the locks
	// for which Queued reports nothing. keepAlive, if not nil, renews the
	// grant until a renewal fails, and returns that error; a nil
	// keepAlive means the grant lives as long as its process without it.
	Lock(ctx context.Context, impl int, key string, onWait func()) (unlock, keepAlive func(context.Context) error, err error)

	// Queued returns how many calls of lock impl hold or wait for key, as
	// the server sees them; ok is false for a lock whose waiters the
	// server does not show, whose Lock calls onWait instead.
	Queued(ctx context.Context, impl int, key string) (n int64, ok bool, err error)

	// Rank increments the counter of lock impl's key and returns its new
	// value: under the lock, the place of the caller's grant in the grant
	// order.
	Rank(ctx context.Context, impl int, key string) (int64, error)

	// Close closes the locks and the connection.
	Close() error
}

// ErrNotGranted is what a lock call's error wraps when the call gave up:
// its tries ran out, or the wait bound passed. An engine wraps it in an
// error of its own name.
var ErrNotGranted = errors.New("not granted")
