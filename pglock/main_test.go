package pglock

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// The tests of the protocol run against real PostgreSQL servers started
// by pgtest: one shared by the tests that do not stop it (each on a
// prefix of its own), and one of their own for those that do.

var (
	sharedOnce sync.Once
	shared     *pgtest.Server
	sharedErr  error
)

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role)) // process_test.go
	}
	code := m.Run()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// server returns the shared server, started on first use.
func server(t testing.TB) *pgtest.Server {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = pgtest.NewServer() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// setup returns a pool of the shared server (at most maxConns
// connections; 0: pgxpool's default; its connections' application_name
// is the test's name) with the schema in place, and a space whose prefix
// is the test's name.
func setup(t testing.TB, maxConns int32) (*pgxpool.Pool, space) {
	t.Helper()
	pool := server(t).NewPool(t, func(c *pgxpool.Config) {
		if maxConns > 0 {
			c.MaxConns = maxConns
		}
		c.ConnConfig.RuntimeParams["application_name"] = t.Name()
	})
	if err := ensureSchema(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool, newSpace(t.Name() + "#" + fmt.Sprint(prefixes.Add(1)))
}

// prefixes numbers the tests' prefixes, so that a test run again
// (-count) on the shared server starts on empty queues.
var prefixes atomic.Int64

// testTTL is the TTL of the tests' sessions: long enough never to expire
// by itself during a test (tests that need an expired session expire it
// with expire).
const testTTL = time.Minute

// newSession returns a new session of s with TTL ttl.
func newSession(t testing.TB, pool *pgxpool.Pool, s space, ttl time.Duration) int64 {
	t.Helper()
	id, err := createSession(context.Background(), pool, s, sessionInfo{Name: t.Name(), Host: "testhost", PID: os.Getpid()}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// expire makes session expire now by the server's clock, as if its
// Locker had stopped renewing it a TTL ago.
func expire(t testing.TB, pool *pgxpool.Pool, session int64) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		`UPDATE fairlock_sessions SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE id = $1`, session)
	if err != nil {
		t.Fatal(err)
	}
}

// seqs hands out call numbers, unique in the test binary (a session's
// numbers need only be unique in it).
var seqs atomic.Int64

// mustEnqueue enqueues a call of mode m (weight w of size n for units)
// by session on key and returns its ref, outcome and token.
func mustEnqueue(t testing.TB, pool *pgxpool.Pool, s space, key string, session int64, m mode, w, n int64, try bool) (callRef, enqueued, int64) {
	t.Helper()
	ref := callRef{Session: session, Seq: seqs.Add(1)}
	out, token, other, err := enqueue(context.Background(), pool, s, key, call{ref: ref, mode: m, weight: w, size: n, label: "label-" + string(m)}, try)
	if err != nil {
		t.Fatalf("enqueue %s on %q: %v", m, key, err)
	}
	if out == otherSize {
		t.Fatalf("enqueue %s on %q: other size %d", m, key, other)
	}
	return ref, out, token
}

// mustRelease releases ref on key and returns whether its row was there.
func mustRelease(t testing.TB, pool *pgxpool.Pool, s space, key string, ref callRef) bool {
	t.Helper()
	removed, _, err := release(context.Background(), pool, s, key, ref)
	if err != nil {
		t.Fatalf("release %v on %q: %v", ref, key, err)
	}
	return removed
}

// grantedRefs returns the calls on key that hold it, by listCalls.
func grantedRefs(t testing.TB, pool *pgxpool.Pool, s space, key string) []callRef {
	t.Helper()
	calls, err := listCalls(context.Background(), pool, s, key)
	if err != nil {
		t.Fatal(err)
	}
	var out []callRef
	for _, c := range calls {
		if c.Granted {
			out = append(out, c.Ref)
		}
	}
	return out
}

// notices collects the notices of a channel through a listener, for
// tests that check what was announced.
type notices struct {
	mu   sync.Mutex
	got  []callRef
	ch   chan struct{} // a signal after each notice
	ups  atomic.Int64
	errs chan error
}

// listenTo starts a listener on s's channel, stopped by t.Cleanup.
func listenTo(t testing.TB, pool *pgxpool.Pool, s space, check time.Duration) *notices {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := dialListener(ctx, pool, s.channel)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	n := &notices{ch: make(chan struct{}, 1), errs: make(chan error, 100)}
	l := &listener{
		pool: pool, channel: s.channel, check: check,
		notice: func(refs []callRef) {
			n.mu.Lock()
			n.got = append(n.got, refs...)
			n.mu.Unlock()
			select {
			case n.ch <- struct{}{}:
			default:
			}
		},
		up: func() { n.ups.Add(1) },
		down: func(err error) {
			select {
			case n.errs <- err:
			default:
			}
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx, conn)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return n
}

// await waits until the notices received include every one of want, at
// most 10 s, and returns everything received so far.
func (n *notices) await(t testing.TB, want ...callRef) []callRef {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		n.mu.Lock()
		got := append([]callRef(nil), n.got...)
		n.mu.Unlock()
		if containsAll(got, want) {
			return got
		}
		select {
		case <-n.ch:
		case <-deadline:
			t.Fatalf("notices %v lack some of %v", got, want)
		}
	}
}

// take returns the notices received so far and forgets them.
func (n *notices) take() []callRef {
	n.mu.Lock()
	defer n.mu.Unlock()
	got := n.got
	n.got = nil
	return got
}

func containsAll(got, want []callRef) bool {
	have := make(map[callRef]bool, len(got))
	for _, r := range got {
		have[r] = true
	}
	for _, r := range want {
		if !have[r] {
			return false
		}
	}
	return true
}

// dispatcher wakes the calls that notices name, as a Locker's hub will:
// a call registers before its enqueue is sent, so a notice that arrives
// before the enqueue's reply still finds it.
type dispatcher struct {
	mu      sync.Mutex
	waiting map[callRef]chan struct{}
}

// dispatch starts a listener on s's channel that wakes d's calls,
// stopped by t.Cleanup.
func dispatch(t testing.TB, pool *pgxpool.Pool, s space) *dispatcher {
	t.Helper()
	d := &dispatcher{waiting: map[callRef]chan struct{}{}}
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := dialListener(ctx, pool, s.channel)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &listener{pool: pool, channel: s.channel, check: testTTL,
		notice: d.notice, up: func() {}, down: func(err error) { t.Log(err) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx, conn)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return d
}

// expect registers ref and returns the channel its grant closes.
func (d *dispatcher) expect(ref callRef) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := make(chan struct{})
	d.waiting[ref] = ch
	return ch
}

// forget drops ref (granted at enqueue, or released).
func (d *dispatcher) forget(ref callRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.waiting, ref)
}

func (d *dispatcher) notice(refs []callRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range refs {
		if ch, ok := d.waiting[r]; ok {
			close(ch)
			delete(d.waiting, r)
		}
	}
}

// lock enqueues a call of mode m by session on key and waits for its
// grant through d (never by reading the queue: a grant that no notice
// announces fails the test after 20 s). It returns the call and its
// token.
func (d *dispatcher) lock(t testing.TB, pool *pgxpool.Pool, s space, key string, session int64, m mode, w, n int64) (callRef, int64, error) {
	ref := callRef{Session: session, Seq: seqs.Add(1)}
	ch := d.expect(ref)
	out, token, _, err := enqueue(context.Background(), pool, s, key, call{ref: ref, mode: m, weight: w, size: n}, false)
	if err != nil {
		d.forget(ref)
		return ref, 0, err
	}
	switch out {
	case granted:
		d.forget(ref)
	case queued:
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			d.forget(ref)
			return ref, token, fmt.Errorf("call %v (token %d) on %q: no notice of its grant within 20 s", ref, token, key)
		}
	default:
		d.forget(ref)
		return ref, token, fmt.Errorf("call %v: outcome %v", ref, out)
	}
	return ref, token, nil
}
