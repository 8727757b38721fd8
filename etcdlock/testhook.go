package etcdlock

import (
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
)

// The hooks that etcdlock's tests reach a Locker's insides through (see
// package testhook).

func init() {
	testhook.PauseWatch = func(l any) func() {
		if s, ok := l.(*Semaphore); ok {
			return pauseWatch(s.e)
		}
		return pauseWatch(l.(*Locker).e)
	}
	testhook.Unsettled = func(l any, key string) int {
		if s, ok := l.(*Semaphore); ok {
			return unsettled(s.e, key)
		}
		return unsettled(l.(*Locker).e, key)
	}
}

// unsettled is testhook.Unsettled (see there): the calls of e on key whose
// turn has not come and whose waiter is not subscribed to its last read
// (a call whose enqueue's reply has not come has no waiter yet), or is
// due to read again (judgeLocked: its nearest keys ahead leave room, and
// there were more).
func unsettled(e *engine, key string) int {
	mu := e.k.Mu()
	mu.Lock()
	defer mu.Unlock()
	n := 0
	e.k.WrittenLocked(func(c *backend.Call) bool {
		if c.Key() == key && c.Queued() {
			if w, ok := c.Data().(*waiter); !ok || !w.subscribed || w.ready() && !w.complete {
				n++
			}
		}
		return true
	})
	return n
}

// pauseWatch is testhook.PauseWatch (see there): it cancels the watch
// behind a gate that watchLoop waits on before it watches again, and
// polls until the hub reports the watch down.
func pauseWatch(e *engine) (resume func()) {
	gate := make(chan struct{})
	h := &e.hub
	h.mu.Lock()
	h.watchGate = gate
	cancel := h.watchCancel
	h.mu.Unlock()
	cancel()
	for {
		h.mu.Lock()
		live := h.live
		h.mu.Unlock()
		if !live {
			return func() { close(gate) }
		}
		time.Sleep(time.Millisecond)
	}
}
