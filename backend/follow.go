package backend

import (
	"context"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// Follow runs the life of one feed of key's changes (a backend's
// keylock.Follower) around the engine's part: start, called with the
// feed's context and the channel it delivers on, reads the key's state
// (one round trip or more, bounded by ctx) and returns the loop that
// sends the first Change and every later one on ch, and returns when the
// context ends. Follow checks ctx and the Locker first, as every call
// does; it runs the loop on a goroutine that Close waits for, and closes
// ch when the loop returns; the feed's context ends with ctx or when
// Close begins. It returns a *fairlock.LockError naming "Follow" and key
// that wraps the context's error, fairlock.ErrClosed, or start's error.
// A nil ctx panics.
func (k *Core) Follow(ctx context.Context, key string, start func(ctx context.Context, ch chan<- keylock.Change) (loop func(), err error)) (<-chan keylock.Change, error) {
	if ctx == nil {
		panic(k.pkg + ": Follow with a nil context")
	}
	switch {
	case ctx.Err() != nil:
		return nil, CallError(ctx, "Follow", key, ctx.Err())
	case k.closing.Err() != nil:
		return nil, CallError(ctx, "Follow", key, fairlock.ErrClosed)
	}
	fctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(k.closing, cancel)
	end := func() {
		stop()
		cancel()
	}
	ch := make(chan keylock.Change)
	loop, err := start(fctx, ch)
	if err != nil {
		end()
		if ctx.Err() == nil && k.closing.Err() != nil {
			err = fairlock.ErrClosed
		}
		return nil, CallError(ctx, "Follow", key, err)
	}
	// Started under the Core's mutex, where Close marks its beginning:
	// either Close has begun (and the feed is not started) or its wait
	// for the Core's goroutines comes after this one is counted.
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closing.Err() != nil {
		end()
		return nil, CallError(ctx, "Follow", key, fairlock.ErrClosed)
	}
	k.Go(func() {
		defer close(ch)
		defer end()
		loop()
	})
	return ch, nil
}
