package debug_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// Account is a pointer key whose holder writes through it.
type Account struct {
	ID      int
	Balance int
}

// TestPointerKeysAreNotRead: a holder writes *acct under the lock while
// dumps, the long-held watchdog and a refused TryLock's error render the
// key. Rendering must not read the account (under -race, reading it is a
// data race with the holder); it shows type and address, or the
// WithKeyFormatter result.
func TestPointerKeysAreNotRead(t *testing.T) {
	for _, formatted := range []bool{false, true} {
		t.Run(fmt.Sprint("formatter=", formatted), func(t *testing.T) {
			logs := newCapture()
			opts := []fairlock.Option{fairlock.WithName("accounts"), fairlock.WithLongHeld(time.Millisecond), fairlock.WithLogger(slog.New(logs))}
			ids := map[*Account]int{}
			acct := &Account{ID: 7}
			ids[acct] = acct.ID // read once, before any holder writes
			if formatted {
				opts = append(opts, fairlock.WithKeyFormatter(func(a *Account) string { return fmt.Sprintf("account-%d", ids[a]) }))
			}
			l := fairlock.New[*Account](opts...)
			defer l.Close(context.Background())
			g, err := l.Lock(context.Background(), acct)
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // the holder, writing what it holds
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						acct.Balance++
					}
				}
			}()
			var buf bytes.Buffer
			for range 20 {
				buf.Reset()
				if err := debug.Dump(&buf); err != nil {
					t.Fatal(err)
				}
			}
			_, err = l.TryLock(owner.NewContext(context.Background()), acct)
			msg := err.Error()
			warning := logs.next(t, "fairlock: lock held too long")
			close(stop)
			wg.Wait()
			g.Unlock()

			want := fmt.Sprintf("(*debug_test.Account)(%p)", acct)
			if formatted {
				want = "account-7"
			}
			if !strings.Contains(buf.String(), want) {
				t.Errorf("dump does not render the key as %s:\n%s", want, buf.String())
			}
			if !strings.Contains(msg, want) || strings.Contains(msg, "Balance") {
				t.Errorf("error %q does not render the key as %s", msg, want)
			}
			if warning["key"] != want {
				t.Errorf("warning renders the key as %v, want %s", warning["key"], want)
			}
		})
	}
}

// Resource is a key whose String method takes a mutex of its own, as a
// key type guarding its fields might.
type Resource struct{ name string }

var (
	resourceMu  sync.Mutex
	inString    = make(chan struct{}, 1) // String was entered
	stringCalls atomic.Int64
)

func (r Resource) String() string {
	stringCalls.Add(1)
	select {
	case inString <- struct{}{}:
	default:
	}
	resourceMu.Lock()
	defer resourceMu.Unlock()
	return r.name
}

// TestStringMethodRunsOutsideShardMutex: a goroutine holds resourceMu
// while a dump, or the watchdog with no dump at all, renders a held
// Resource key and so waits in String for resourceMu; the goroutine then
// calls TryLock on the key's shard. If String ran under the shard mutex,
// the TryLock would wait for the shard mutex and String for resourceMu:
// both forever, and every later call on the shard with them.
func TestStringMethodRunsOutsideShardMutex(t *testing.T) {
	for _, via := range []string{"dump", "watchdog"} {
		t.Run(via, func(t *testing.T) {
			opts := []fairlock.Option{fairlock.WithName("resources-" + via), fairlock.WithShards(1), fairlock.WithDebug()}
			if via == "watchdog" {
				opts = append(opts, fairlock.WithLongHeld(time.Millisecond), fairlock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			}
			l := fairlock.New[Resource](opts...)
			ctx := context.Background()
			g, err := l.Lock(ctx, Resource{"printer"})
			if err != nil {
				t.Fatal(err)
			}
			select { // drain a signal left by an earlier render
			case <-inString:
			default:
			}
			resourceMu.Lock()
			rendered := make(chan struct{})
			if via == "dump" {
				go func() { defer close(rendered); _ = debug.Dump(io.Discard) }()
			}
			<-inString // a render waits for resourceMu, which this goroutine holds
			tried := make(chan error, 1)
			go func() {
				g2, err := l.TryLock(ctx, Resource{"scanner"}) // the same shard: there is one
				if err == nil {
					g2.Unlock()
				}
				tried <- err
			}()
			select {
			case err := <-tried:
				resourceMu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("deadlock: a key's String method ran under the shard mutex")
			}
			if via == "dump" {
				<-rendered
			}
			g.Unlock()
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// dumpText returns the text of a dump.
func dumpText(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	if err := debug.Dump(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// OrderID is a named string key.
type OrderID string

// TestKeysCannotForgeLines: a string-kind key holding a newline and a
// forged dump line is quoted everywhere it is shown: the dump, an error,
// a warning; no control character gets through raw.
func TestKeysCannotForgeLines(t *testing.T) {
	logs := newCapture()
	l := fairlock.New[OrderID](fairlock.WithName("orders"), fairlock.WithLongHeld(time.Millisecond), fairlock.WithLogger(slog.New(logs)))
	defer l.Close(context.Background())
	evil := OrderID("order-1\n  \"order-17\" exclusive, held 999h LONG\x1b[2J")
	g, err := l.Lock(context.Background(), evil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	_, err = l.TryLock(owner.NewContext(context.Background()), evil)
	if !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatal(err)
	}
	warning := logs.next(t, "fairlock: lock held too long")
	text := dumpText(t)
	block := text[strings.Index(text, `fairlock "orders"`):]
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), `"order-17"`) {
			t.Fatalf("a key forged a dump line:\n%s", block)
		}
	}
	quoted := `"order-1\n  \"order-17\" exclusive, held 999h LONG\x1b[2J"`
	// A structured record carries the key without the text forms' quotes
	// (its handler quotes and escapes on its own), control characters
	// still escaped.
	bare := `order-1\n  "order-17" exclusive, held 999h LONG\x1b[2J`
	if w := fmt.Sprint(warning["key"]); w != bare {
		t.Errorf("warning carries the key as %q; want %q", w, bare)
	}
	for what, s := range map[string]string{"dump": block, "error": err.Error(), "warning": fmt.Sprint(warning["key"])} {
		if what != "warning" && !strings.Contains(s, quoted) {
			t.Errorf("%s does not quote the key as %s: %q", what, quoted, s)
		}
		if strings.ContainsAny(strings.TrimSuffix(s, "\n"), "\x1b") || (what != "dump" && strings.Contains(s, "\n")) {
			t.Errorf("%s carries a control character raw: %q", what, s)
		}
	}
}

// TestNoNegativeAges: snapshots read during churn over many shards never
// report a negative age: each shard's clock is read under its mutex.
func TestNoNegativeAges(t *testing.T) {
	l := fairlock.New[int](fairlock.WithName("ages"), fairlock.WithDebug(), fairlock.WithShards(4096))
	defer l.Close(context.Background())
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				lctx, cancel := context.WithTimeout(ctx, 50*time.Microsecond)
				g, err := l.Lock(lctx, (w*7+i)%64)
				cancel()
				if err == nil {
					g.Unlock()
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	seen := 0
	for range 200 {
		for _, st := range debug.Snapshot() {
			if st.Name != "ages" {
				continue
			}
			for _, k := range st.Held {
				seen++
				if k.HeldFor < 0 {
					t.Fatalf("key %s held for %v", k.Key, k.HeldFor)
				}
				for _, h := range k.Holders {
					if h.For < 0 {
						t.Fatalf("holder of %s: age %v", k.Key, h.For)
					}
				}
				for _, w := range k.Waiters {
					if w.For < 0 {
						t.Fatalf("waiter of %s: age %v", k.Key, w.For)
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no key was ever seen held: the test checked nothing")
	}
}

// TestSnapshotShowsModes: shared holders are all listed, waiters carry
// their mode, a Semaphore shows its units per key, per holder and per
// waiter.
func TestSnapshotShowsModes(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string](fairlock.WithName("modes"), fairlock.WithDebug())
	defer l.Close(ctx)
	r1, _ := l.RLock(owner.NewContext(ctx), "k")
	r2, _ := l.RLock(owner.NewContext(ctx), "k")
	var wg sync.WaitGroup
	for i, call := range []func(context.Context) error{
		func(ctx context.Context) error { g, err := l.Lock(ctx, "k"); g.Unlock(); return err },
		func(ctx context.Context) error { return l.Wait(ctx, "k") },
		func(ctx context.Context) error { g, err := l.RLock(ctx, "k"); g.Unlock(); return err },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = call(owner.NewContext(ctx)) }()
		for l.Waiters("k") != i+1 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	s := fairlock.NewSemaphore[string](5, fairlock.WithName("units"), fairlock.WithDebug())
	defer s.Close(ctx)
	u1, _ := s.Acquire(owner.NewContext(ctx), "k", 2)
	u2, _ := s.Acquire(owner.NewContext(ctx), "k", 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		g, err := s.Acquire(owner.NewContext(ctx), "k", 4)
		if err == nil {
			g.Unlock()
		}
	}()
	for s.Waiters("k") != 1 {
		time.Sleep(100 * time.Microsecond)
	}

	states := debug.Snapshot()
	k := findLocker(t, states, "modes").Held[0]
	if k.Mode != debug.Shared || len(k.Holders) != 2 || k.Holders[0].Token >= k.Holders[1].Token {
		t.Errorf("shared key: mode %q, %d holders %+v; want shared, 2, in grant order", k.Mode, len(k.Holders), k.Holders)
	}
	var modes []string
	for _, w := range k.Waiters {
		modes = append(modes, w.Mode)
	}
	if want := []string{debug.Exclusive, debug.Wait, debug.Shared}; fmt.Sprint(modes) != fmt.Sprint(want) {
		t.Errorf("waiter modes %v, want %v in queue order", modes, want)
	}
	st := findLocker(t, states, "units")
	k = st.Held[0]
	if st.Kind != "Semaphore" || st.Units != 5 || k.Mode != debug.Units || k.Units != 5 ||
		k.Holders[0].Units != 2 || k.Holders[1].Units != 3 || k.Waiters[0].Units != 4 || k.Waiters[0].Mode != debug.Units {
		t.Errorf("semaphore state %+v", st)
	}
	if text := dumpText(t); !strings.Contains(text, `fairlock "units" (Semaphore of 5 units per key): 1 key, 1 waiter;`) || !strings.Contains(text, `"k" units 5 of 5 units`) ||
		!regexp.MustCompile(`holder: \S+ token \d+ \(2 units\) for `).MatchString(text) || !regexp.MustCompile(`waiter 1: \S+ units \(4 units\) waiting `).MatchString(text) {
		t.Errorf("dump lacks the semaphore's units:\n%s", text)
	}
	r1.Unlock()
	r2.Unlock()
	u1.Unlock()
	u2.Unlock()
	wg.Wait()
}
