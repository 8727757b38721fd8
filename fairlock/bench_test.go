package fairlock_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
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

// BenchmarkUncontendedModes cycles each kind of grant and its Unlock over
// 4096 keys on one goroutine: the lock-free path serves them all alike,
// and none allocates.
func BenchmarkUncontendedModes(b *testing.B) {
	ctx := context.Background()
	keys := benchKeys(4096)
	l := fairlock.New[string]()
	defer l.Close(ctx)
	s := fairlock.NewSemaphore[string](4)
	defer s.Close(ctx)
	for name, take := range map[string]func(string) (fairlock.Guard[string], error){
		"Lock":       func(k string) (fairlock.Guard[string], error) { return l.Lock(ctx, k) },
		"RLock":      func(k string) (fairlock.Guard[string], error) { return l.RLock(ctx, k) },
		"Acquire(2)": func(k string) (fairlock.Guard[string], error) { return s.Acquire(ctx, k, 2) },
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var tokens uint64
			for i := 0; i < b.N; i++ {
				g, err := take(keys[i&4095])
				if err != nil {
					b.Fatal(err)
				}
				tokens += g.Token()
				g.Unlock()
			}
			_ = tokens
		})
	}
}

// BenchmarkReadMostly: G goroutines on one key, nine RLocks in ten, each
// hold a short spin: shared holds let readers overlap where a Lock would
// serialize them.
func BenchmarkReadMostly(b *testing.B) {
	for _, G := range []int{8, 32} {
		b.Run("G="+strconv.Itoa(G), func(b *testing.B) {
			l := fairlock.New[string]()
			ctx := context.Background()
			var wg sync.WaitGroup
			var left atomic.Int64
			left.Store(int64(b.N))
			b.ReportAllocs()
			b.ResetTimer()
			for w := range G {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; left.Add(-1) >= 0; i++ {
						take := l.RLock
						if i%10 == 0 {
							take = l.Lock
						}
						g, err := take(ctx, "hot")
						if err != nil {
							b.Error(err)
							return
						}
						spin(200)
						g.Unlock()
					}
				}()
			}
			wg.Wait()
		})
	}
}

var spinSink atomic.Int64

// spin does n units of work without blocking.
func spin(n int) {
	x := 0
	for i := range n {
		x += i * i
	}
	spinSink.Add(int64(x & 1))
}

// BenchmarkIdleWatchdog: a Locker with a long-held watchdog and no key in
// use, for each shard count: the CPU the process takes, as a share of one
// CPU over the run (cpu-share). The watchdog sleeps without a timer while
// no key is live, and a tick visits only shards with live keys, so this
// stays near zero whatever the shard count. Each op is one millisecond.
func BenchmarkIdleWatchdog(b *testing.B) {
	for _, shards := range []int{64, 4096, 65536} {
		b.Run("shards="+strconv.Itoa(shards), func(b *testing.B) {
			l := fairlock.New[string](fairlock.WithShards(shards), fairlock.WithLongHeld(4*time.Millisecond))
			defer l.Close(context.Background())
			start, cpu0 := time.Now(), processCPU(b)
			b.ResetTimer()
			time.Sleep(time.Duration(b.N) * time.Millisecond)
			b.StopTimer()
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Since(start)), "cpu-share")
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Skip("getrusage:", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// BenchmarkManyReaders: n flows hold one key shared at once, then leave
// in an order unlike their grants'; one op is one RLock and its Unlock.
// The per-op cost should not grow with n: a reentrancy check of many
// holders uses an owner index, and a release a binary search.
func BenchmarkManyReaders(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run("n="+strconv.Itoa(n), func(b *testing.B) {
			l := fairlock.New[string]()
			defer l.Close(context.Background())
			ctxs := make([]context.Context, n)
			for i := range ctxs {
				ctxs[i] = owner.NewContext(context.Background())
			}
			guards := make([]fairlock.Guard[string], n)
			b.ReportAllocs()
			for done := 0; done < b.N; done += n {
				for i := range guards {
					g, err := l.RLock(ctxs[i], "k")
					if err != nil {
						b.Fatal(err)
					}
					guards[i] = g
				}
				for i := 0; i < n; i += 2 {
					guards[i].Unlock()
				}
				for i := n - 1; i >= 0; i -= 2 {
					guards[i].Unlock()
				}
			}
		})
	}
}

// BenchmarkDeadlockCheck: key 0 is held shared by flows 0 and X. Flows 0
// to n-2 each hold key i and wait for key i+1; flow n-1 holds key n-1 and
// waits for nothing, so the chain can finish, last flow first. X waits for
// key n, held by the requester, whose Lock of key 0 would close the cycle
// requester → X → requester. One op is that refused Lock: one check of
// the wait-for graph, which visits the whole chain and should cost time
// in proportion to n (a linear reduction, not one sweep per flow that
// finishes). Logging is disabled.
func BenchmarkDeadlockCheck(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run("chain="+strconv.Itoa(n), func(b *testing.B) {
			quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
			l := fairlock.New[int](fairlock.WithDeadlockDetection(), fairlock.WithLogger(quiet))
			bg := context.Background()
			requester := owner.NewContext(bg)
			ctx, cancel := context.WithCancel(bg)
			x := owner.NewContext(ctx)
			var held []fairlock.Guard[int]
			take := func(g fairlock.Guard[int], err error) {
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, g)
			}
			take(l.Lock(requester, n))
			take(l.RLock(x, 0))
			flows := make([]context.Context, n)
			for i := range flows {
				flows[i] = owner.NewContext(ctx)
				if i == 0 {
					take(l.RLock(flows[i], i))
				} else {
					take(l.Lock(flows[i], i))
				}
			}
			var wg sync.WaitGroup
			wait := func(flow context.Context, key int) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l.Lock(flow, key) // ends with the cancel below
				}()
				for l.Waiters(key) != 1 {
					runtime.Gosched()
				}
			}
			for i, flow := range flows[:n-1] {
				wait(flow, i+1)
			}
			wait(x, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := l.Lock(requester, 0); !errors.Is(err, fairlock.ErrDeadlock) {
					b.Fatalf("Lock closing a cycle beside a chain of %d: %v", n, err)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			for _, g := range held {
				g.Unlock()
			}
			l.Close(bg)
		})
	}
}
