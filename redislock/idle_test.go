package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// TestIdleKeysLeaveNothing: 20,000 distinct keys (order ids, say) locked
// once each leave nothing on the server once they have been idle for
// ten TTLs: no counter, no marker, no queue. A keyed lock's memory
// follows the keys in use, not every key ever locked.
func TestIdleKeysLeaveNothing(t *testing.T) {
	c := redistest.Start(t)
	const ttl = 500 * time.Millisecond // the idle period is 10 TTLs
	l := newLocker(t, c, "idle", redislock.WithTTL(ttl))
	ctx := context.Background()
	const keys, workers = 20000, 32
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= keys || t.Failed() {
					return
				}
				key := "order-" + strconv.FormatInt(i, 10)
				g, err := l.Lock(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				// A grant held past its renewal deadline on a loaded
				// machine (the TTL is short) is lost, and leaves nothing
				// all the same.
				if err := g.Unlock(ctx); err != nil && !errors.Is(err, redislock.ErrLost) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	locked := time.Now()
	size, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys locked once each in %v; the server holds %d keys", keys, locked.Sub(start), size)
	deadline := locked.Add(10*ttl + 15*time.Second)
	for size > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the server still holds %d keys %v after the last Unlock; want none after the idle period (10 TTLs, %v)", size, time.Since(locked), 10*ttl)
		}
		time.Sleep(100 * time.Millisecond)
		if size, err = c.DBSize(ctx).Result(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the server holds no key %v after the last Unlock", time.Since(locked))
}
