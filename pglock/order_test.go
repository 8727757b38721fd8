package pglock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// TestConcurrentEnqueues runs many goroutines, over sessions of their own
// and a pool of 8 connections, that lock one key again and again (each
// lock waiting only for its notice), and checks that no two ever hold it
// at once, that no grant goes unannounced, and that each grant's token is
// larger than the previous holder's. Enqueues of one key commit in id
// order only because each takes the key's advisory lock: without it (tried
// by removing lockKey from enqueue) an enqueue that reads the queue while
// an earlier id is still in flight is granted beside it, and a release and
// an enqueue that miss each other leave a call that no notice wakes.
func TestConcurrentEnqueues(t *testing.T) {
	for _, tc := range []struct {
		name    string
		readers bool
	}{{"exclusive", false}, {"readers and writers", true}} {
		t.Run(tc.name, func(t *testing.T) {
			pool, s := setup(t, 8)
			d := dispatch(t, pool, s)
			const workers, rounds = 16, 25
			sessions := make([]int64, 4)
			for i := range sessions {
				sessions[i] = newSession(t, pool, s, testTTL)
			}
			var writers, readers atomic.Int64
			var last atomic.Int64 // the last writer's token
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range rounds {
						m := modeExclusive
						if tc.readers && (w+i)%3 != 0 {
							m = modeShared
						}
						ref, token, err := d.lock(t, pool, s, "k", sessions[w%len(sessions)], m, 0, 0)
						if err != nil {
							errs <- err
							return
						}
						if m == modeExclusive {
							if n := writers.Add(1); n != 1 || readers.Load() != 0 {
								t.Errorf("writer %v (token %d) holds beside %d writers and %d readers", ref, token, n-1, readers.Load())
							}
							if prev := last.Swap(token); prev >= token {
								t.Errorf("writer token %d after %d", token, prev)
							}
							writers.Add(-1)
						} else {
							readers.Add(1)
							if writers.Load() != 0 {
								t.Errorf("reader %v (token %d) holds beside a writer", ref, token)
							}
							readers.Add(-1)
						}
						if _, _, err := release(context.Background(), pool, s, "k", ref); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n, _ := locked(context.Background(), pool, s, "k"); n {
				t.Error("calls left on the key")
			}
		})
	}
}

// TestSimultaneousFirstCalls starts calls on a free key at once from many
// goroutines (Lock and TryLock), round after round on new keys, and checks that exactly one
// is granted each time: a call that reads the queue while an earlier one
// is in flight must not find it empty. Without the key's advisory lock
// around the enqueue (tried by removing lockKey from enqueue), two or more
// of them were granted in most rounds.
func TestSimultaneousFirstCalls(t *testing.T) {
	pool, s := setup(t, 8)
	sess := newSession(t, pool, s, testTTL)
	for round := range 20 {
		key := "k" + string(rune('a'+round))
		start := make(chan struct{})
		var grants atomic.Int64
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ref := callRef{Session: sess, Seq: seqs.Add(1)}
				out, _, _, err := enqueue(context.Background(), pool, s, key, call{ref: ref, mode: modeExclusive}, i%2 == 0)
				if err != nil {
					t.Error(err)
					return
				}
				if out == granted {
					grants.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := grants.Load(); n != 1 {
			t.Errorf("round %d: %d calls granted on a free key at once, want 1", round, n)
		}
	}
}
