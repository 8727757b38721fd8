package flight_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
)

// The tests of Cache run its cross-process logic in one process: each
// "process" is a Cache of its own over its own view of one
// fairlock.Locker (keylock.InProcess), and they share a memStore.

// memStore is an in-memory Store that fences its writes with the
// grant's token, as a real one should.
type memStore struct {
	mu      sync.Mutex
	entries map[string]flight.Entry[string]
	fence   map[string]uint64 // the largest token accepted per key
	sets    []set             // every Set, accepted or not
	getErr  error
}

// set is one call of memStore.Set.
type set struct {
	key      string
	e        flight.Entry[string]
	ttl      time.Duration
	token    uint64
	accepted bool
}

func newMemStore() *memStore {
	return &memStore{entries: map[string]flight.Entry[string]{}, fence: map[string]uint64{}}
}

func (s *memStore) Get(_ context.Context, key string) (flight.Entry[string], bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.getErr != nil {
		return flight.Entry[string]{}, false, s.getErr
	}
	e, ok := s.entries[key]
	return e, ok, nil
}

func (s *memStore) Set(_ context.Context, key string, e flight.Entry[string], ttl time.Duration, l keylock.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok := l.Token()
	ok := tok >= s.fence[key]
	s.sets = append(s.sets, set{key, e, ttl, tok, ok})
	if !ok {
		return fmt.Errorf("memStore: token %d after %d: %w", tok, s.fence[key], flight.ErrFenced)
	}
	s.fence[key] = tok
	s.entries[key] = e
	return nil
}

func (s *memStore) put(key string, e flight.Entry[string]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries[key] = e
}

func (s *memStore) entry(key string) (flight.Entry[string], bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	return e, ok
}

func (s *memStore) calls() []set {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]set(nil), s.sets...)
}

// clock is a settable clock the tests' Caches read.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// counting is a Locker that counts the calls made through it.
type counting struct {
	keylock.Locker
	calls atomic.Int32
}

func (c *counting) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	c.calls.Add(1)
	return c.Locker.Lock(ctx, key)
}

func (c *counting) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	c.calls.Add(1)
	return c.Locker.TryLock(ctx, key)
}

func (c *counting) Wait(ctx context.Context, key string) error {
	c.calls.Add(1)
	return c.Locker.Wait(ctx, key)
}

// logBuffer collects what the Caches log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// world is the shared half of the tests' "processes": one Locker, one
// store, one clock, one log.
type world struct {
	l     *fairlock.Locker[string]
	store *memStore
	clock *clock
	logs  *logBuffer
}

// logger returns a logger that writes to w's log.
func (w *world) logger() flight.Option {
	return flight.WithLogger(slog.New(slog.NewTextHandler(w.logs, nil)))
}

func newWorld(t *testing.T) *world {
	t.Helper()
	l := fairlock.New[string]()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &world{l: l, store: newMemStore(), clock: newClock(), logs: &logBuffer{}}
}

// process returns a Cache of its own over a view of w's Locker, w's
// store and clock, with rand as XFetch's draw (nil: 0.5).
func (w *world) process(rand func() float64, opts ...flight.Option) (*flight.Cache[string], *counting) {
	lk := &counting{Locker: keylock.InProcess(w.l)}
	c := flight.NewCache[string](lk, w.store, time.Minute, append([]flight.Option{w.logger()}, opts...)...)
	if rand == nil {
		rand = func() float64 { return 0.5 }
	}
	flight.SetClock(c, w.clock.Now, rand)
	return c, lk
}

// result is a Get's results.
type result struct {
	v   string
	err error
}

func getAsync(ctx context.Context, c *flight.Cache[string], key string, fill func(context.Context, keylock.Lease) (string, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, err := c.Get(ctx, key, fill)
		ch <- result{v, err}
	}()
	return ch
}

// noFill is a fill that must not run.
func noFill(t *testing.T, who string) func(context.Context, keylock.Lease) (string, error) {
	return func(context.Context, keylock.Lease) (string, error) {
		t.Errorf("%s filled", who)
		return "", errors.New("unexpected fill")
	}
}

// TestCacheOneFill: four processes of 50 concurrent callers each, on a
// missing key: one fill in all, while the three others Wait; every
// caller gets its value, stored once under the filler's grant.
func TestCacheOneFill(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	const procs, callers = 4, 50
	var fills atomic.Int32
	release := make(chan struct{})
	var caches []*flight.Cache[string]
	var results []<-chan result
	var tokens sync.Map
	for p := range procs {
		c, _ := w.process(nil)
		caches = append(caches, c)
		fill := func(ctx context.Context, l keylock.Lease) (string, error) {
			fills.Add(1)
			tokens.Store(l.Token(), true)
			<-release
			return fmt.Sprintf("value of process %d", p), nil
		}
		for range callers {
			results = append(results, getAsync(ctx, c, "k", fill))
		}
	}
	await(t, "one process holds the key and three Wait", func() bool { return w.l.Locked("k") && w.l.Waiters("k") == procs-1 })
	for p, c := range caches {
		await(t, fmt.Sprintf("process %d's callers share its load", p), func() bool { return flight.LoadWaiting(c, "k") == callers })
	}
	close(release)
	var first string
	for i, ch := range results {
		r := recv(t, ch, "a caller's value")
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if i == 0 {
			first = r.v
		}
		if r.v != first {
			t.Errorf("caller %d got %q, caller 0 %q", i, r.v, first)
		}
	}
	if fills.Load() != 1 {
		t.Errorf("%d fills for %d callers in %d processes, want 1", fills.Load(), procs*callers, procs)
	}
	sets := w.store.calls()
	if len(sets) != 1 || !sets[0].accepted || sets[0].e.Value != first || sets[0].ttl != time.Minute {
		t.Fatalf("store writes: %+v, want one, of the value, for the TTL", sets)
	}
	if _, ok := tokens.Load(sets[0].token); !ok {
		t.Errorf("the store write's token %d is not the filling grant's", sets[0].token)
	}
	if e := sets[0].e; !e.Expires.Equal(w.clock.Now().Add(time.Minute)) || e.Err != "" {
		t.Errorf("the stored entry: %+v, want a value expiring a TTL after the fill", e)
	}
	if w.l.Len() != 0 {
		t.Errorf("%d keys held or awaited after every Get returned", w.l.Len())
	}
}

// TestCacheFreshValue: a fresh value is read from the store; nothing is
// locked or filled. Once it has expired, it is filled again.
func TestCacheFreshValue(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.store.put("k", flight.Entry[string]{Value: "cached", Expires: w.clock.Now().Add(time.Second)})
	c, lk := w.process(nil)
	v, err := c.Get(ctx, "k", noFill(t, "a Get of a fresh value"))
	if v != "cached" || err != nil {
		t.Errorf("Get: (%q, %v), want the stored value", v, err)
	}
	if n := lk.calls.Load(); n != 0 {
		t.Errorf("%d lock calls for a fresh value, want none", n)
	}
	w.clock.Add(time.Second) // Expires is the first instant it is stale
	v, err = c.Get(ctx, "k", func(context.Context, keylock.Lease) (string, error) { return "refilled", nil })
	if v != "refilled" || err != nil {
		t.Errorf("Get of an expired value: (%q, %v), want a fill", v, err)
	}
	if e, _ := w.store.entry("k"); e.Value != "refilled" {
		t.Errorf("stored: %+v", e)
	}
}

// TestCacheFillErrorReachesWaiters: a fill that fails leaves an error
// record for WithErrorTTL: the filler's callers get the fill's error, the
// process that waited on it a *FillError without filling, and so does a
// later call until the record expires; then a call fills again.
func TestCacheFillErrorReachesWaiters(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	opt := flight.WithErrorTTL(5 * time.Second)
	a, _ := w.process(nil, opt)
	b, _ := w.process(nil, opt)
	c, lkc := w.process(nil, opt)
	errDown := errors.New("database down")
	release := make(chan struct{})
	ra := getAsync(ctx, a, "k", func(context.Context, keylock.Lease) (string, error) {
		<-release
		return "", errDown
	})
	await(t, "a fills", func() bool { return w.l.Locked("k") })
	rb := getAsync(ctx, b, "k", noFill(t, "the process that waited on a failed fill"))
	await(t, "b waits", func() bool { return w.l.Waiters("k") == 1 })
	close(release)
	if r := recv(t, ra, "the filler's caller"); r.err != errDown {
		t.Errorf("the filler's caller: %v, want the fill's error as it is", r.err)
	}
	var fe *flight.FillError
	r := recv(t, rb, "the waiter")
	if !errors.As(r.err, &fe) || fe.Key != "k" || fe.Msg != errDown.Error() || !fe.Until.Equal(w.clock.Now().Add(5*time.Second)) {
		t.Errorf("the waiter: %v, want a *FillError for k with the fill's message until the record's expiry", r.err)
	}
	_, err := c.Get(ctx, "k", noFill(t, "a call within the error TTL"))
	if !errors.As(err, &fe) {
		t.Errorf("a later call within the error TTL: %v, want a *FillError", err)
	}
	if lkc.calls.Load() != 0 {
		t.Error("a call that found the error record used the lock")
	}
	w.clock.Add(5 * time.Second)
	v, err := c.Get(ctx, "k", func(context.Context, keylock.Lease) (string, error) { return "back", nil })
	if v != "back" || err != nil {
		t.Errorf("a call after the error TTL: (%q, %v), want a fill", v, err)
	}
	sets := w.store.calls()
	if len(sets) != 2 || sets[0].e.Err != errDown.Error() || sets[0].ttl != 5*time.Second || sets[1].e.Value != "back" {
		t.Errorf("store writes: %+v, want the error record then the value", sets)
	}
}

// TestCacheWithoutErrorRecords: WithErrorTTL(0) writes no record; the
// waiter then fills itself, after the failed fill.
func TestCacheWithoutErrorRecords(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, _ := w.process(nil, flight.WithErrorTTL(0))
	b, _ := w.process(nil, flight.WithErrorTTL(0))
	release := make(chan struct{})
	ra := getAsync(ctx, a, "k", func(context.Context, keylock.Lease) (string, error) {
		<-release
		return "", errors.New("failed")
	})
	await(t, "a fills", func() bool { return w.l.Locked("k") })
	rb := getAsync(ctx, b, "k", func(context.Context, keylock.Lease) (string, error) { return "b's", nil })
	await(t, "b waits", func() bool { return w.l.Waiters("k") == 1 })
	close(release)
	if r := recv(t, ra, "a"); r.err == nil {
		t.Error("a's fill failed, but its caller got no error")
	}
	if r := recv(t, rb, "b"); r.v != "b's" || r.err != nil {
		t.Errorf("b: %+v, want its own fill", r)
	}
	if sets := w.store.calls(); len(sets) != 1 || sets[0].e.Value != "b's" {
		t.Errorf("store writes: %+v, want b's value alone", sets)
	}
}

// TestCacheAbandonedFillIsTakenOver: when every caller of the filling
// process leaves, its fill's context ends (cause ErrAbandoned), it writes
// nothing and releases the key; the waiting process queues and fills:
// exactly one fill more.
func TestCacheAbandonedFillIsTakenOver(t *testing.T) {
	w := newWorld(t)
	a, _ := w.process(nil)
	b, _ := w.process(nil)
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cause := make(chan error, 1)
	ra := getAsync(actx, a, "k", func(ctx context.Context, _ keylock.Lease) (string, error) {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return "", ctx.Err()
	})
	await(t, "a fills", func() bool { return w.l.Locked("k") })
	var bFills atomic.Int32
	rb := getAsync(context.Background(), b, "k", func(context.Context, keylock.Lease) (string, error) {
		bFills.Add(1)
		return "b's", nil
	})
	await(t, "b waits", func() bool { return w.l.Waiters("k") == 1 })
	cancel()
	if r := recv(t, ra, "a's caller, once its context ended"); !errors.Is(r.err, context.Canceled) {
		t.Errorf("a's caller: %+v, want context.Canceled", r)
	}
	if c := recv(t, cause, "a's fill's context ends"); c != flight.ErrAbandoned {
		t.Errorf("a's fill's context's cause: %v, want ErrAbandoned", c)
	}
	if r := recv(t, rb, "b"); r.v != "b's" || r.err != nil {
		t.Errorf("b: %+v, want its own fill", r)
	}
	if bFills.Load() != 1 {
		t.Errorf("b filled %d times", bFills.Load())
	}
	if sets := w.store.calls(); len(sets) != 1 || sets[0].e.Value != "b's" {
		t.Errorf("store writes: %+v, want b's value alone (an abandoned fill writes no error record)", sets)
	}
}

// losing is a Locker whose Leases can be lost: the in-process lock with a
// Lost channel the test closes.
type losing struct {
	keylock.Locker
	lost chan struct{}
}

type losingLease struct {
	keylock.Lease
	lost chan struct{}
}

func (l losingLease) Lost() <-chan struct{} { return l.lost }

func (l *losing) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	g, err := l.Locker.TryLock(ctx, key)
	if err != nil {
		return nil, err
	}
	return losingLease{g, l.lost}, nil
}

// TestCacheLostGrant: a fill's context ends when its grant is lost, with
// a cause that wraps fairlock.ErrLost; what it returns then is not
// stored (a fenced store would refuse it; one that cannot fence must not
// get it), an error leaves no record, and its callers get its result.
func TestCacheLostGrant(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
	}{{"value", nil}, {"error", errors.New("cut off")}} {
		lk := &losing{Locker: keylock.InProcess(w.l), lost: make(chan struct{})}
		c := flight.NewCache[string](lk, w.store, time.Minute, w.logger())
		causes := make(chan error, 1)
		r := getAsync(ctx, c, "k-"+tc.name, func(ctx context.Context, _ keylock.Lease) (string, error) {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return "late", tc.err
		})
		await(t, "the fill runs", func() bool { return w.l.Locked("k-" + tc.name) })
		close(lk.lost)
		if cause := recv(t, causes, "the fill's context ends on the loss"); !errors.Is(cause, fairlock.ErrLost) {
			t.Errorf("%s: the fill's context's cause: %v, want one wrapping ErrLost", tc.name, cause)
		}
		got := recv(t, r, "the caller")
		if tc.err == nil && (got.v != "late" || got.err != nil) || tc.err != nil && got.err != tc.err {
			t.Errorf("%s: the caller: %+v", tc.name, got)
		}
	}
	if sets := w.store.calls(); len(sets) != 0 {
		t.Errorf("store writes after a lost grant: %+v, want none", sets)
	}
	if logs := w.logs.String(); !strings.Contains(logs, "not storing a fill whose grant was lost") {
		t.Errorf("the log does not say why the value was not stored:\n%s", logs)
	}
}

// TestCacheFencedWrite: the store gets the filling grant's Lease, so a
// fill under an older grant is refused once a newer one has written;
// the refused fill's callers still get their value.
func TestCacheFencedWrite(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	c, _ := w.process(nil)
	// A newer grant of k has written already: its token is above every
	// token this Locker will give before it.
	w.store.mu.Lock()
	w.store.fence["k"] = 1 << 62
	w.store.mu.Unlock()
	v, err := c.Get(ctx, "k", func(context.Context, keylock.Lease) (string, error) { return "stale", nil })
	if v != "stale" || err != nil {
		t.Errorf("Get: (%q, %v), want the fill's value though the store refused it", v, err)
	}
	sets := w.store.calls()
	if len(sets) != 1 || sets[0].accepted {
		t.Errorf("store writes: %+v, want one, refused", sets)
	}
	if _, ok := w.store.entry("k"); ok {
		t.Error("the refused write was stored")
	}
	if logs := w.logs.String(); !strings.Contains(logs, "level=INFO") || !strings.Contains(logs, "store write refused") {
		t.Errorf("the refused write is not logged as expected (INFO):\n%s", logs)
	}
}

// TestCacheEarlyRefresh: with WithEarlyRefresh, a call that draws a
// refresh before the expiry (XFetch) refills under the key's grant while
// every other call, of its process or another, gets the old value at
// once, including one that also drew a refresh but found the key taken.
// One fill in all; the new value replaces the old.
func TestCacheEarlyRefresh(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	opt := flight.WithEarlyRefresh(1)
	t0 := w.clock.Now()
	w.store.put("k", flight.Entry[string]{Value: "old", Expires: t0.Add(10 * time.Second), Delta: time.Second})
	w.clock.Add(7 * time.Second) // 3 s before the expiry
	// −δ·β·ln(0.01) = 4.6 s ≥ 3 s: early. −δ·β·ln(1) = 0: not early.
	refresher, _ := w.process(func() float64 { return 0.01 }, opt)
	other, _ := w.process(func() float64 { return 1 }, opt)
	alsoEarly, _ := w.process(func() float64 { return 0.01 }, opt)
	release := make(chan struct{})
	var fills atomic.Int32
	r := getAsync(ctx, refresher, "k", func(context.Context, keylock.Lease) (string, error) {
		fills.Add(1)
		<-release
		return "new", nil
	})
	await(t, "the refresh holds the key", func() bool { return w.l.Locked("k") })
	if v, err := other.Get(ctx, "k", noFill(t, "a call that drew no refresh")); v != "old" || err != nil {
		t.Errorf("a call during the refresh: (%q, %v), want the old value", v, err)
	}
	if v, err := alsoEarly.Get(ctx, "k", noFill(t, "a second early refresh")); v != "old" || err != nil {
		t.Errorf("an early call while the key is taken: (%q, %v), want the old value at once", v, err)
	}
	close(release)
	if got := recv(t, r, "the refreshing call"); got.v != "new" || got.err != nil {
		t.Errorf("the refreshing call: %+v, want the new value", got)
	}
	if e, _ := w.store.entry("k"); e.Value != "new" || !e.Expires.Equal(w.clock.Now().Add(time.Minute)) {
		t.Errorf("stored: %+v, want the new value for a TTL", e)
	}
	if fills.Load() != 1 {
		t.Errorf("%d fills, want 1", fills.Load())
	}
	// Far from the expiry, the same draw refreshes nothing.
	if v, err := refresher.Get(ctx, "k", noFill(t, "a call far from the expiry")); v != "new" || err != nil {
		t.Errorf("Get: (%q, %v)", v, err)
	}
}

// TestCacheEarlyRefreshFailureKeepsOld: a refresh whose fill fails
// returns the old value, still fresh, and writes no error record.
func TestCacheEarlyRefreshFailureKeepsOld(t *testing.T) {
	w := newWorld(t)
	t0 := w.clock.Now()
	old := flight.Entry[string]{Value: "old", Expires: t0.Add(time.Second), Delta: time.Second}
	w.store.put("k", old)
	c, _ := w.process(func() float64 { return 0.01 }, flight.WithEarlyRefresh(1))
	v, err := c.Get(context.Background(), "k", func(context.Context, keylock.Lease) (string, error) {
		return "", errors.New("refresh failed")
	})
	if v != "old" || err != nil {
		t.Errorf("Get: (%q, %v), want the old value", v, err)
	}
	if e, _ := w.store.entry("k"); e != old || len(w.store.calls()) != 0 {
		t.Errorf("the store changed: %+v, %+v", e, w.store.calls())
	}
	if logs := w.logs.String(); !strings.Contains(logs, "early refresh failed") || !strings.Contains(logs, "refresh failed") {
		t.Errorf("the failed refresh is not logged:\n%s", logs)
	}
}

// TestCachePanicInFill: a panic in fill reaches the filler's callers as a
// *PanicError after the key is released; the waiting process then fills.
func TestCachePanicInFill(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, _ := w.process(nil)
	b, _ := w.process(nil)
	release := make(chan struct{})
	ra := getAsync(ctx, a, "k", func(context.Context, keylock.Lease) (string, error) {
		<-release
		panic("fill broke")
	})
	await(t, "a fills", func() bool { return w.l.Locked("k") })
	rb := getAsync(ctx, b, "k", func(context.Context, keylock.Lease) (string, error) { return "b's", nil })
	await(t, "b waits", func() bool { return w.l.Waiters("k") == 1 })
	close(release)
	var pe *flight.PanicError
	if r := recv(t, ra, "a"); !errors.As(r.err, &pe) || pe.Value != "fill broke" {
		t.Errorf("a: %v, want a *PanicError", r.err)
	}
	if r := recv(t, rb, "b"); r.v != "b's" || r.err != nil {
		t.Errorf("b: %+v, want its own fill", r)
	}
}

// TestCacheStoreError: a store that cannot be read fails the call with
// an error naming the key and wrapping the store's.
func TestCacheStoreError(t *testing.T) {
	w := newWorld(t)
	errStore := errors.New("store unreachable")
	w.store.getErr = errStore
	c, _ := w.process(nil)
	_, err := c.Get(context.Background(), "order-7", noFill(t, "a call whose store failed"))
	if !errors.Is(err, errStore) || err.Error() != `flight: reading "order-7" from the store: store unreachable` {
		t.Errorf("Get: %v", err)
	}
}

// TestNewCachePanics: NewCache refuses a nil Locker or Store and a TTL
// that is not positive.
func TestNewCachePanics(t *testing.T) {
	w := newWorld(t)
	v := keylock.InProcess(w.l)
	for name, f := range map[string]func(){
		"nil Locker": func() { flight.NewCache[string](nil, w.store, time.Second) },
		"nil Store":  func() { flight.NewCache[string](v, nil, time.Second) },
		"zero TTL":   func() { flight.NewCache[string](v, w.store, 0) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewCache with a %s did not panic", name)
				}
			}()
			f()
		}()
	}
}
