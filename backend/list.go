package backend

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/keylock"
)

// Listing a key's calls across processes: Calls, which a backend's
// Locker exposes as keylock.Lister when its engine is a Lister, and the
// debug views' reads of the calls ahead of this Locker's (ahead).

// errNoList is what Calls wraps for an engine that cannot list.
var errNoList = errors.New("the engine cannot list a key's calls")

// Calls lists key's calls across every process, as the engine's List
// reads them (keylock.Lister.Calls says what the listing holds). It
// returns a *fairlock.LockError with Op "Calls" naming the key and the
// owner of ctx, wrapping the context's error if ctx ends first (the read
// may go on; Close waits for it), fairlock.ErrClosed once Close has
// begun, errors.ErrUnsupported if the engine is not a Lister, or the
// engine's error. A nil ctx panics.
func (k *Core) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	if ctx == nil {
		panic(k.pkg + ": Calls with a nil context")
	}
	ls, ok := k.engine.(Lister)
	switch {
	case !ok:
		return nil, CallError(ctx, "Calls", key, errors.Join(errors.ErrUnsupported, errNoList))
	case ctx.Err() != nil:
		return nil, CallError(ctx, "Calls", key, ctx.Err())
	case k.closing.Err() != nil:
		return nil, CallError(ctx, "Calls", key, errClosed)
	}
	var calls []keylock.CallInfo
	var err, lerr error // calls, lerr: written by the goroutine, read only once it returned
	if k.bounded(ctx, func() { calls, lerr = ls.List(ctx, key) }) {
		err = lerr
	} else {
		err = ctx.Err()
	}
	if err != nil {
		return nil, CallError(ctx, "Calls", key, err)
	}
	return calls, nil
}

// aheadBudget bounds the reads one debug state makes (DebugState must not
// block on the engine for long): keys left when it is spent show why
// instead (KeyState.AheadError).
const aheadBudget = 250 * time.Millisecond

// ahead fills in, for each key of ks (keys[i] is ks[i]'s key, unquoted),
// the calls of other processes ahead of this Locker's last call on it,
// read one key after another from the engine within aheadBudget in all.
// It does nothing for an engine that cannot list. It takes no mutex of
// the Core's but the janitor's count of pending work (bounded).
func (k *Core) ahead(keys []string, ks []registry.KeyState) {
	ls, ok := k.engine.(Lister)
	if !ok || len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(k.bg, aheadBudget)
	defer cancel()
	for i, key := range keys {
		if ctx.Err() != nil {
			ks[i].AheadError = "the time allowed to read the engine was spent on other keys"
			continue
		}
		var calls []keylock.CallInfo
		var err, lerr error
		if k.bounded(ctx, func() { calls, lerr = ls.List(ctx, key) }) {
			err = lerr
		} else {
			err = ctx.Err()
		}
		if err != nil {
			ks[i].AheadError = err.Error()
			continue
		}
		ks[i].Ahead = aheadOf(calls, k.process)
	}
}

// aheadOf returns the calls of calls that were not made by the Locker of
// process me and come before its last call, or all the others if none
// is its own (it read the queue an instant before or after its calls
// were there).
func aheadOf(calls []keylock.CallInfo, me keylock.Process) []registry.RemoteState {
	last := len(calls)
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].Process == me {
			last = i
			break
		}
	}
	var out []registry.RemoteState
	for _, c := range calls[:last] {
		if c.Process == me {
			continue
		}
		out = append(out, registry.RemoteState{
			Host: c.Process.Host, PID: c.Process.PID, Locker: c.Process.Locker,
			Label: c.Label, Mode: c.Mode, Units: c.Units, Held: c.Held, Token: c.Token, Age: c.Age,
		})
	}
	return out
}
