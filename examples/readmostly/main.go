// Command readmostly shows shared holds paying off on a read-mostly key.
//
// A product catalog entry is read by many requests and updated by a few.
// Each request holds the entry for as long as it takes to serve it (an
// I/O-bound read of its own, simulated by a sleep). The same workload runs
// twice on a fairlock.Locker: once with every request taking the entry
// exclusively (Lock), once with readers taking it shared (RLock) and only
// writers exclusively. Readers then overlap, so reads go through at the
// rate of many holders instead of one, while writers still get their turn
// in arrival order: a reader that arrives behind a queued writer waits for
// it, so no writer starves behind a stream of readers.
//
//	go run ./examples/readmostly [-duration 1s] [-clients 32] [-writes 10]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

type config struct {
	duration time.Duration // per run
	clients  int           // goroutines issuing requests
	writes   int           // percent of requests that write
	hold     time.Duration // how long a request holds the entry
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", time.Second, "how long each of the two runs lasts")
	flag.IntVar(&cfg.clients, "clients", 32, "concurrent clients")
	flag.IntVar(&cfg.writes, "writes", 10, "percent of requests that write")
	flag.DurationVar(&cfg.hold, "hold", 200*time.Microsecond, "how long a request holds the entry")
	flag.Parse()
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// stats is what one run measured.
type stats struct {
	reads, writes  int64
	maxWriterWait  time.Duration
	p99WriterWait  time.Duration
	readersAtOnce  int64 // the most readers seen holding together
	writerOverlaps int64 // times a holder found a writer beside it: must be 0
}

func run(cfg config, w io.Writer) error {
	if cfg.clients < 1 || cfg.writes < 0 || cfg.writes > 100 {
		return fmt.Errorf("need clients >= 1 and writes in 0..100")
	}
	fmt.Fprintf(w, "read-mostly key: %d clients, %d%% writes, each request holds the entry %v, %v per run\n\n",
		cfg.clients, cfg.writes, cfg.hold, cfg.duration)
	excl, err := measure(cfg, false)
	if err != nil {
		return err
	}
	shared, err := measure(cfg, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%-28s %14s %14s\n", "", "Lock for all", "RLock to read")
	fmt.Fprintf(w, "%-28s %14.0f %14.0f\n", "reads/s", rate(excl.reads, cfg), rate(shared.reads, cfg))
	fmt.Fprintf(w, "%-28s %14.0f %14.0f\n", "writes/s", rate(excl.writes, cfg), rate(shared.writes, cfg))
	fmt.Fprintf(w, "%-28s %14d %14d\n", "most readers holding at once", excl.readersAtOnce, shared.readersAtOnce)
	fmt.Fprintf(w, "%-28s %14v %14v\n", "writer wait p99", excl.p99WriterWait.Round(time.Microsecond), shared.p99WriterWait.Round(time.Microsecond))
	fmt.Fprintf(w, "%-28s %14v %14v\n", "writer wait max", excl.maxWriterWait.Round(time.Microsecond), shared.maxWriterWait.Round(time.Microsecond))
	fmt.Fprintf(w, "%-28s %14d %14d\n", "a writer beside a holder", excl.writerOverlaps, shared.writerOverlaps)
	if excl.writerOverlaps+shared.writerOverlaps != 0 {
		return fmt.Errorf("a writer held the entry beside another holder")
	}
	ratio := rate(shared.reads, cfg) / max(rate(excl.reads, cfg), 1)
	fmt.Fprintf(w, "\nshared holds served %.1f× the reads; writers were still granted in arrival order (one run: figures vary from run to run)\n", ratio)
	return nil
}

func rate(n int64, cfg config) float64 { return float64(n) / cfg.duration.Seconds() }

// measure runs the workload once: readers take the entry shared if
// sharedReads, exclusively otherwise.
func measure(cfg config, sharedReads bool) (stats, error) {
	catalog := fairlock.New[string](fairlock.WithName("catalog"))
	defer catalog.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration)
	defer cancel()

	var (
		st      stats
		readers atomic.Int64 // holding now
		writers atomic.Int64 // holding now
		mu      sync.Mutex
		waits   []time.Duration // writers'
		wg      sync.WaitGroup
		failed  atomic.Value
	)
	for c := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flow := owner.NewContext(ctx)
			for i := c; ctx.Err() == nil; i++ {
				write := i%100 < cfg.writes
				take := catalog.Lock
				if sharedReads && !write {
					take = catalog.RLock
				}
				start := time.Now()
				g, err := take(flow, "sku-1")
				if err != nil {
					if ctx.Err() == nil {
						failed.Store(err)
					}
					return
				}
				waited := time.Since(start)
				if write {
					if writers.Add(1) > 1 || readers.Load() > 0 {
						atomic.AddInt64(&st.writerOverlaps, 1)
					}
				} else {
					n := readers.Add(1)
					if writers.Load() > 0 {
						atomic.AddInt64(&st.writerOverlaps, 1)
					}
					for m := atomic.LoadInt64(&st.readersAtOnce); n > m && !atomic.CompareAndSwapInt64(&st.readersAtOnce, m, n); m = atomic.LoadInt64(&st.readersAtOnce) {
					}
				}
				time.Sleep(cfg.hold)
				if write {
					writers.Add(-1)
					atomic.AddInt64(&st.writes, 1)
					mu.Lock()
					waits = append(waits, waited)
					mu.Unlock()
				} else {
					readers.Add(-1)
					atomic.AddInt64(&st.reads, 1)
				}
				g.Unlock()
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return st, err
	}
	if catalog.Len() != 0 {
		return st, fmt.Errorf("%d keys held after the run", catalog.Len())
	}
	slices.Sort(waits)
	if n := len(waits); n > 0 {
		st.maxWriterWait = waits[n-1]
		st.p99WriterWait = waits[(n*99)/100]
	}
	return st, nil
}
