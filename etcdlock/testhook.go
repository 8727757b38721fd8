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
			return pauseWatch(s.l)
		}
		return pauseWatch(l.(*Locker))
	}
}

// pauseWatch is testhook.PauseWatch (see there): it cancels the watch
// behind a gate that watchLoop waits on before it watches again, and
// polls until the hub reports the watch down.
func pauseWatch(l *Locker) (resume func()) {
	gate := make(chan struct{})
	l.mu.Lock()
	l.hub.watchGate = gate
	cancel := l.hub.watchCancel
	l.mu.Unlock()
	cancel()
	for {
		l.mu.Lock()
		live := l.hub.live
		l.mu.Unlock()
		if !live {
			return func() { close(gate) }
		}
		time.Sleep(time.Millisecond)
	}
}
