package etcdlock

import "time"

// PauseWatch ends l's watch on its prefix, as a compaction or a lost
// leader would, and holds off the next one until resume is called: the
// deletions made meanwhile reach l only through the listing it rebuilds
// its subscriptions from.
func PauseWatch(l *Locker) (resume func()) {
	gate := make(chan struct{})
	l.mu.Lock()
	l.watchGate = gate
	cancel := l.watchCancel
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
