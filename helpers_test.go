package fairlock_test

import (
	"context"
	"maps"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// waitFor polls cond until it holds, yielding the processor between tries.
// It fails the test after a minute: that is a lost wake-up or a hang, not
// a slow machine.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

// waitWaiters blocks until key has n queued waiters.
func waitWaiters[K comparable](t testing.TB, l *fairlock.Locker[K], key K, n int) {
	t.Helper()
	waitFor(t, "the key has its waiters", func() bool { return l.Waiters(key) == n })
}

// recv returns the next value from ch, failing the test if none arrives
// within a minute.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("timed out waiting for a result: lost wake-up?")
		panic("unreachable")
	}
}

// mustNotReceive fails if ch has a value ready now.
func mustNotReceive[T any](t testing.TB, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s: got %v", what, v)
	default:
	}
}

// A lockerConfig is one way to build a Locker. The end-to-end tests of the
// lock's rules run under each: a Locker with debug or an observer keeps
// every shard under its mutex for good (no lock-free fast path) and reads
// the clock on every grant, and deadlock detection updates the wait-for
// graph on every queue change, so each is a different path through Lock,
// the hand-off and cancellation.
type lockerConfig struct {
	name string
	opts func(*tally) []fairlock.Option
}

var lockerConfigs = []lockerConfig{
	{"plain", func(*tally) []fairlock.Option { return nil }},
	{"debug", func(*tally) []fairlock.Option {
		// The watchdog then walks the shards every millisecond,
		// concurrently with the test, and warns about every holder.
		return []fairlock.Option{fairlock.WithDebug(), fairlock.WithStacks(), fairlock.WithLongHeld(time.Microsecond), quiet()}
	}},
	{"observer", func(o *tally) []fairlock.Option { return []fairlock.Option{fairlock.WithObserver(o)} }},
	{"deadlock-detection", func(*tally) []fairlock.Option { return []fairlock.Option{fairlock.WithDeadlockDetection()} }},
}

// forEachConfig runs test as one subtest per lockerConfig.
func forEachConfig(t *testing.T, test func(t *testing.T, c lockerConfig)) {
	for _, c := range lockerConfigs {
		t.Run(c.name, func(t *testing.T) { test(t, c) })
	}
}

// newLocker builds a Locker under c with extra options, and the tally its
// observer (if c has one) reports to. Cleanup closes the Locker, which stops
// its watchdog, and fails the test if a key is still held by then.
func newLocker[K comparable](t testing.TB, c lockerConfig, extra ...fairlock.Option) (*fairlock.Locker[K], *tally) {
	t.Helper()
	o := new(tally)
	l := fairlock.New[K](append(c.opts(o), extra...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close at the end of the test: %v", err)
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.registered && o.unregistered != 1 {
			t.Errorf("the observer was unregistered %d times after Close, want once", o.unregistered)
		}
	})
	return l, o
}

// tally is a fairlock.Observer for tests: it counts the results reported
// to it and the releases, and whether the Locker registered and
// unregistered, and keeps the Locker's live counts (live).
type tally struct {
	mu           sync.Mutex
	registered   bool
	unregistered int
	results      map[fairlock.Result]int
	releases     int
	stats        func() fairlock.Stats
}

func (o *tally) Register(_ string, stats func() fairlock.Stats) fairlock.LockerObserver {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.registered = true
	o.stats = stats
	return o
}

// live reads the live counts of the Locker registered with o, as a
// metrics collection would.
func (o *tally) live() fairlock.Stats {
	o.mu.Lock()
	stats := o.stats
	o.mu.Unlock()
	return stats()
}

func (o *tally) Acquire(r fairlock.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.results == nil {
		o.results = map[fairlock.Result]int{}
	}
	o.results[r]++
}

func (o *tally) Release(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.releases++
}

func (o *tally) Unregister() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unregistered++
}

// counts returns a copy of the results and the number of releases, and
// whether any Locker reports to o at all.
func (o *tally) counts() (results map[fairlock.Result]int, releases int, observed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.results), o.releases, o.registered
}

// checkTally compares what the Locker reported to o with what the test
// counted: the number of calls per result and of releases. It checks
// nothing under a config without an observer.
func checkTally(t testing.TB, o *tally, want map[fairlock.Result]int, releases int) {
	t.Helper()
	got, gotReleases, observed := o.counts()
	if !observed {
		return
	}
	want = maps.Clone(want) // leave the caller's map as it was
	maps.DeleteFunc(want, func(_ fairlock.Result, n int) bool { return n == 0 })
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("results reported to the observer (-want +got):\n%s", diff)
	}
	if gotReleases != releases {
		t.Errorf("observer heard %d releases, want %d", gotReleases, releases)
	}
}
