package fairlock

import (
	"sync"
	"sync/atomic"
	"time"
)

// debugState is a table's debug-mode machinery: its registration with
// the debug registry and its long-held watchdog, with the live-shard
// bitmap the watchdog walks. It holds no reference to the table, so that
// a table dropped without Close can be collected.
type debugState struct {
	longHeld   time.Duration // 0: no watchdog
	unregister func()        // from the debug registry; safe to call twice
	quit       chan struct{} // closed by stopWatchdog
	wake       chan struct{} // the first live key since the watchdog slept
	done       sync.WaitGroup
	stopOnce   sync.Once
	// liveShards has a bit per shard that has live keys, and liveCount
	// counts those shards; only with a watchdog, which walks just those
	// shards and sleeps while there are none.
	liveShards []atomic.Uint64
	liveCount  atomic.Int64
}

// markLive records whether shard i has live keys, for the watchdog, and
// wakes the watchdog when the first shard gets some. The per-key protocol
// calls it (settle) when a shard becomes live or idle.
func (d *debugState) markLive(i uint32, live bool) {
	if d.liveShards == nil {
		return
	}
	word, bit := &d.liveShards[i/64], uint64(1)<<(i%64)
	if !live {
		word.And(^bit)
		d.liveCount.Add(-1)
		return
	}
	word.Or(bit)
	if d.liveCount.Add(1) == 1 {
		select {
		case d.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// stopWatchdog stops the watchdog and waits for it to exit.
func (d *debugState) stopWatchdog() {
	d.stopOnce.Do(func() {
		close(d.quit)
		d.done.Wait()
	})
}
