package proccmp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// The scenarios across processes run the locks in worker processes (see
// StartProc). A worker of a lock comparison reads these commands, IMPL
// an index into Engine.Names:
//
//	wait IMPL KEY ID        lock KEY; "queued ID" if the call had to wait
//	                        (the locks whose Lock calls onWait: a peer's
//	                        first try failed), then, after the grant, an
//	                        increment of the key's rank counter (Rank) under
//	                        the lock and the unlock, "granted ID UNIXNANO
//	                        RANK" (UNIXNANO: the time Lock returned), or
//	                        "gaveup ID UNIXNANO" when the call gave up
//	hold IMPL KEY           lock KEY, "held", and keep the grant (its
//	                        keepAlive, if any) until the process is killed
//	hot IMPL KEY G START D  from START (Unix ns) for D (ns), G goroutines
//	                        lock and unlock KEY in a loop; "hot N1 … NG",
//	                        the grants of each
//
// and answers "error ID MESSAGE" for a call that failed otherwise.

// RunWorker runs a worker process of e's comparison (e.IsWorker) until
// its stdin closes, and returns its exit code: 2 if its spec cannot be
// read, 1 if open fails, else 0. open makes the process's locks from the
// spec the parent passed to Start.
func RunWorker[S any](e *Engine, open func(spec S) (Locks, error)) int {
	var spec S
	if err := ReadSpec(e.Env, &spec); err != nil {
		fmt.Fprintln(os.Stderr, e.Name+" worker:", err)
		return 2
	}
	ls, err := open(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, e.Name+" worker:", err)
		return 1
	}
	defer ls.Close()
	w := &worker{ls: ls}
	in := bufio.NewScanner(os.Stdin)
	var wg sync.WaitGroup
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) < 3 {
			w.say("error", "-", "bad command", strconv.Quote(in.Text()))
			continue
		}
		impl, _ := strconv.Atoi(f[1])
		wg.Go(func() { w.do(impl, f) })
	}
	wg.Wait()
	return 0
}

// worker is a worker process's state.
type worker struct {
	ls Locks
	mu sync.Mutex // serialises lines on stdout
}

func (w *worker) say(fields ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Println(fields...)
}

// do runs one command, f: its name, implementation, key and arguments.
func (w *worker) do(impl int, f []string) {
	ctx := owner.NewContext(context.Background())
	key := f[2]
	if need := map[string]int{"wait": 4, "hold": 3, "hot": 6}[f[0]]; len(f) < need {
		w.say("error", "-", "bad command", strings.Join(f, " "))
		return
	}
	switch f[0] {
	case "wait":
		id := f[3]
		unlock, _, err := w.ls.Lock(ctx, impl, key, func() { w.say("queued", id) })
		at := time.Now().UnixNano()
		if errors.Is(err, ErrNotGranted) {
			w.say("gaveup", id, at)
			return
		}
		if err != nil {
			w.say("error", id, err)
			return
		}
		rank, err := w.ls.Rank(ctx, impl, key)
		if uerr := unlock(ctx); err == nil {
			err = uerr
		}
		if err != nil {
			w.say("error", id, err)
			return
		}
		w.say("granted", id, at, rank)
	case "hold":
		_, keepAlive, err := w.ls.Lock(ctx, impl, key, nil)
		if err != nil {
			w.say("error", "hold", err)
			return
		}
		w.say("held")
		if keepAlive == nil {
			select {}
		}
		w.say("error", "hold", keepAlive(ctx))
	case "hot":
		g, _ := strconv.Atoi(f[3])
		start, _ := strconv.ParseInt(f[4], 10, 64)
		d, _ := strconv.ParseInt(f[5], 10, 64)
		counts, err := w.hot(ctx, impl, key, g, time.Unix(0, start), time.Duration(d))
		if err != nil {
			w.say("error", "hot", err)
			return
		}
		out := []any{"hot"}
		for _, n := range counts {
			out = append(out, n)
		}
		w.say(out...)
	default:
		w.say("error", "-", "unknown command", f[0])
	}
}

// hot runs g goroutines, each its own owner, that lock and unlock key
// from start until start+d, and returns the grants of each. A call still
// waiting at the end is cut off by the context's deadline and not counted.
func (w *worker) hot(ctx context.Context, impl int, key string, g int, start time.Time, d time.Duration) ([]int, error) {
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(ctx, start.Add(d))
	defer cancel()
	counts := make([]int, g)
	errs := make([]error, g)
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			ctx := owner.NewContext(ctx)
			for ctx.Err() == nil {
				unlock, _, err := w.ls.Lock(ctx, impl, key, nil)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, ErrNotGranted) {
						errs[i] = err
						return
					}
					continue
				}
				counts[i]++
				if err := unlock(context.Background()); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return counts, errors.Join(errs...)
}
