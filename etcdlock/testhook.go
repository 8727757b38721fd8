package etcdlock

import (
	"time"

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
