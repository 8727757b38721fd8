package fairlock_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
)

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
	}
	return keys
}

// BenchmarkUncontended cycles Lock+Unlock over 4096 keys on one goroutine.
// With debug and observer off it must report 0 allocs/op. "shard-busy"
// holds one other key on the Locker's only shard throughout, so every
// cycle takes the shard mutex instead of the lock-free fast path: the cost
// of a key whose shard is not idle.
func BenchmarkUncontended(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []fairlock.Option
	}{
		{"plain", nil},
		{"shard-busy", []fairlock.Option{fairlock.WithShards(1)}},
		{"debug", []fairlock.Option{fairlock.WithDebug()}},
		{"debug+stacks", []fairlock.Option{fairlock.WithStacks()}},
		{"deadlock-detection", []fairlock.Option{fairlock.WithDeadlockDetection()}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := fairlock.New[string](bc.opts...)
			defer l.Close(context.Background())
			keys := benchKeys(4096)
			ctx := context.Background()
			if bc.name == "shard-busy" {
				g, err := l.Lock(ctx, "pinned")
				if err != nil {
					b.Fatal(err)
				}
				defer g.Unlock()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				g, err := l.Lock(ctx, keys[i&4095])
				if err != nil {
					b.Fatal(err)
				}
				g.Unlock()
			}
		})
	}
}

// BenchmarkParallelDistinct: every goroutine locks its own keys.
func BenchmarkParallelDistinct(b *testing.B) {
	l := fairlock.New[string]()
	keys := benchKeys(1 << 16)
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		base := int(next.Add(1)) * 1024
		i := 0
		for pb.Next() {
			g, err := l.Lock(ctx, keys[(base+i&1023)&(1<<16-1)])
			if err != nil {
				b.Error(err)
				return
			}
			g.Unlock()
			i++
		}
	})
}

// BenchmarkHotKey: G goroutines on one key; every Unlock is a hand-off.
func BenchmarkHotKey(b *testing.B) {
	for _, G := range []int{2, 8, 32} {
		b.Run("G="+strconv.Itoa(G), func(b *testing.B) {
			l := fairlock.New[string]()
			ctx := context.Background()
			var wg sync.WaitGroup
			var left atomic.Int64
			left.Store(int64(b.N))
			b.ReportAllocs()
			b.ResetTimer()
			for range G {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						g, err := l.Lock(ctx, "hot")
						if err != nil {
							b.Error(err)
							return
						}
						g.Unlock()
					}
				}()
			}
			wg.Wait()
		})
	}
}

// BenchmarkTryLockHeld: the cost of being refused.
func BenchmarkTryLockHeld(b *testing.B) {
	l := fairlock.New[string]()
	ctx := context.Background()
	g, _ := l.Lock(ctx, "k")
	defer g.Unlock()
	other := make(chan struct{})
	b.ReportAllocs()
	go func() {
		defer close(other)
		for i := 0; i < b.N; i++ {
			if _, err := l.TryLock(ctx, "k"); err == nil {
				b.Error("TryLock of a held key succeeded")
			}
		}
	}()
	<-other
}
