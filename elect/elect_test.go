package elect_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// newLocker returns an in-process Locker named name, closed by t.Cleanup,
// and its keylock view.
func newLocker(t *testing.T, name string) (*fairlock.Locker[string], keylock.Locker) {
	t.Helper()
	fl := fairlock.New[string](fairlock.WithName(name))
	t.Cleanup(func() {
		// Bounded: a test that failed may have left a grant held.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fl.Close(ctx)
	})
	return fl, keylock.InProcess(fl)
}

// await polls cond until it holds, failing t after 10 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// campaign runs e.Campaign(ctx, value) on a goroutine and returns the
// channel its Term comes on (nil after an error, which fails t).
func campaign(t *testing.T, ctx context.Context, e *elect.Election, value string) <-chan *elect.Term {
	ch := make(chan *elect.Term, 1)
	go func() {
		term, err := e.Campaign(ctx, value)
		if err != nil {
			t.Error(err)
		}
		ch <- term
	}()
	return ch
}

// recv returns the value that ch delivers, failing t after 10 s.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10 s", what)
	}
	var zero T
	return zero
}

// TestCandidatesLeadInFIFOOrder: three candidates queued in a known order
// lead in that order, each once the one before resigns; each term's
// context ends at its Resign with ErrResigned, before the next term
// begins, and the tokens grow.
func TestCandidatesLeadInFIFOOrder(t *testing.T) {
	fl, l := newLocker(t, "fifo")
	e := elect.New(l, "leader")
	ctx := context.Background()
	first, err := e.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var chs []<-chan *elect.Term
	for i, v := range []string{"b", "c"} {
		chs = append(chs, campaign(t, ctx, e, v))
		await(t, "candidate queued", func() bool { return fl.Waiters("leader") == i+1 })
	}
	terms := []*elect.Term{first}
	for _, ch := range chs {
		prev := terms[len(terms)-1]
		if !prev.Valid() {
			t.Fatalf("term %q not valid before its Resign", prev.Value())
		}
		if err := prev.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if prev.Valid() || !errors.Is(context.Cause(prev.Context()), elect.ErrResigned) {
			t.Fatalf("after Resign: valid %v, cause %v", prev.Valid(), context.Cause(prev.Context()))
		}
		next := recv(t, ch, "the next candidate's term")
		if next == nil {
			t.FailNow()
		}
		if next.Token() <= prev.Token() {
			t.Fatalf("token %d after %d", next.Token(), prev.Token())
		}
		terms = append(terms, next)
	}
	var got []string
	for _, term := range terms {
		got = append(got, term.Value())
	}
	if strings.Join(got, " ") != "a b c" {
		t.Fatalf("leaders %q, want a b c", got)
	}
	if err := terms[2].Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := terms[2].Resign(ctx); err != nil {
		t.Fatalf("a second Resign: %v", err)
	}
	if fl.Len() != 0 {
		t.Fatalf("%d keys live after the last Resign", fl.Len())
	}
}

// TestLeaderFromANonCandidate: an Election that never campaigns reads
// the leader's value, token and process; a vacancy is the zero Leader.
func TestLeaderFromANonCandidate(t *testing.T) {
	_, l := newLocker(t, "reader")
	candidate, observer := elect.New(l, "leader"), elect.New(l, "leader")
	ctx := context.Background()
	if got, err := observer.Leader(ctx); err != nil || !got.Vacant() || got != (elect.Leader{}) {
		t.Fatalf("no candidate: %+v, %v; want the zero Leader", got, err)
	}
	term, err := candidate.Campaign(ctx, "web-1:8080")
	if err != nil {
		t.Fatal(err)
	}
	got, err := observer.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := keylock.Process{Host: keylock.LocalProcess("").Host, PID: os.Getpid(), Locker: "reader"}
	if got.Value != "web-1:8080" || got.Token != term.Token() || got.Process != want || got.Vacant() {
		t.Fatalf("Leader: %+v; want web-1:8080, token %d, %v", got, term.Token(), want)
	}
	if own, _ := candidate.Leader(ctx); !own.Since.Equal(term.Since()) {
		t.Fatalf("the candidate's Election reads since %v, its term began %v", own.Since, term.Since())
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := observer.Leader(ctx); err != nil || !got.Vacant() {
		t.Fatalf("after Resign: %+v, %v; want a vacancy", got, err)
	}
}

// TestObserveEveryChange: a non-candidate's Observe stream shows the
// current state, then each change in order: a leader, the next one after
// a Resign with a candidate queued, a vacancy, and a new leader.
func TestObserveEveryChange(t *testing.T) {
	fl, l := newLocker(t, "observe")
	candidates := elect.New(l, "leader")
	observer := elect.New(l, "leader", elect.WithInterval(5*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := observer.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func(want string, token uint64) {
		t.Helper()
		got := recv(t, stream, "the next change")
		if got.Value != want || got.Token != token {
			t.Fatalf("Observe: %q token %d; want %q token %d", got.Value, got.Token, want, token)
		}
	}
	next("", 0)
	a, err := candidates.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	next("a", a.Token())
	bch := campaign(t, ctx, candidates, "b")
	await(t, "b queued", func() bool { return fl.Waiters("leader") == 1 })
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := recv(t, bch, "b's term")
	next("b", b.Token())
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	next("", 0)
	c, err := candidates.Campaign(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	next("c", c.Token())
	cancel()
	for range stream {
	}
	c.Resign(context.Background())
}

// TestObserveWakesOnLocalTerms: a polling Observe stream (a Locker that
// lists but does not follow) of the Election its candidates campaign
// through sees their terms at once, without waiting for the interval.
func TestObserveWakesOnLocalTerms(t *testing.T) {
	_, l := newLocker(t, "wake")
	e := elect.New(listerOnly{l, l.(keylock.Lister)}, "leader", elect.WithInterval(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, stream, "the first state"); !got.Vacant() {
		t.Fatalf("first: %+v", got)
	}
	term, err := e.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, stream, "the term"); got.Token != term.Token() || !got.Since.Equal(term.Since()) {
		t.Fatalf("got %+v, want token %d since %v", got, term.Token(), term.Since())
	}
	term.Resign(ctx)
	if got := recv(t, stream, "the vacancy"); !got.Vacant() {
		t.Fatalf("after Resign: %+v", got)
	}
}

// deadlineLocker is an in-process Locker whose grants have a Deadline
// the test sets (at, ahead by default), and whose Lost closes when the
// test says: how a distributed backend's grant looks to elect, with the
// clock in the test's hands.
type deadlineLocker struct {
	keylock.Locker
	mu     sync.Mutex
	leases []*deadlineLease
	first  time.Time // the Deadline of the next grant; zero: an hour ahead
}

func (d *deadlineLocker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	l, err := d.Locker.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dl := &deadlineLease{Lease: l, lost: make(chan struct{})}
	at := d.first
	d.first = time.Time{}
	if at.IsZero() {
		at = time.Now().Add(time.Hour)
	}
	dl.at.Store(at.UnixNano())
	d.leases = append(d.leases, dl)
	return dl, nil
}

func (d *deadlineLocker) lease(i int) *deadlineLease {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.leases[i]
}

type deadlineLease struct {
	keylock.Lease
	at   atomic.Int64 // unix ns
	lost chan struct{}
	once sync.Once
}

func (l *deadlineLease) Deadline() time.Time   { return time.Unix(0, l.at.Load()) }
func (l *deadlineLease) Lost() <-chan struct{} { return l.lost }
func (l *deadlineLease) lose()                 { l.once.Do(func() { close(l.lost) }) }
func (l *deadlineLease) set(at time.Time)      { l.at.Store(at.UnixNano()) }

// TestTermEndsAtDeadline: a term's context is done at its first check
// after its grant's Deadline passed (Err reads the clock), with a cause
// wrapping fairlock.ErrLost, though Lost never closed; without a check,
// it ends at the Deadline by a timer, and a renewal that moves the
// Deadline forward moves the end.
func TestTermEndsAtDeadline(t *testing.T) {
	_, inner := newLocker(t, "deadline")
	dl := &deadlineLocker{Locker: inner}
	e := elect.New(dl, "leader")
	term, err := e.Campaign(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// The watch's timer is set for an hour ahead: Err reads the clock
	// itself, as a process resumed after a pause past its deadline needs.
	dl.lease(0).set(time.Now().Add(-time.Millisecond))
	if term.Context().Err() == nil {
		t.Fatal("Err is nil at once after the deadline passed")
	}
	select {
	case <-term.Done():
	default:
		t.Fatal("Err is not nil but Done is open")
	}
	if cause := context.Cause(term.Context()); !errors.Is(cause, fairlock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", cause)
	}
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}

	// The timer alone, and a renewal that moves it: the grant comes with
	// a deadline 500ms ahead, and is renewed to 1s ahead before that.
	dl.mu.Lock()
	dl.first = time.Now().Add(500 * time.Millisecond)
	dl.mu.Unlock()
	term, err = e.Campaign(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	extended := time.Now()
	dl.lease(1).set(extended.Add(time.Second))
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term's Done did not close at its deadline")
	}
	if since := time.Since(extended); since < time.Second {
		t.Fatalf("the term ended %v after its deadline was moved 1s ahead", since)
	}
	term.Resign(context.Background())
}

// TestTermEndsAtLost: a term's context ends when its grant's Lost
// closes, with a cause wrapping fairlock.ErrLost, and Resign then
// returns nil.
func TestTermEndsAtLost(t *testing.T) {
	_, inner := newLocker(t, "lost")
	dl := &deadlineLocker{Locker: inner}
	term, err := elect.New(dl, "leader").Campaign(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	dl.lease(0).lose()
	recv(t, term.Done(), "the term's end")
	if !errors.Is(context.Cause(term.Context()), fairlock.ErrLost) || term.Valid() {
		t.Fatalf("after Lost: cause %v, valid %v", context.Cause(term.Context()), term.Valid())
	}
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestCampaignRefusesAnUncertainGrant: a grant whose Deadline has passed
// by the time Campaign sees it (the process was paused while it waited)
// is given back, and the candidate queues again and leads on the next.
func TestCampaignRefusesAnUncertainGrant(t *testing.T) {
	_, inner := newLocker(t, "uncertain")
	dl := &deadlineLocker{Locker: inner, first: time.Now().Add(-time.Second)}
	term, err := elect.New(dl, "leader").Campaign(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	if len(dl.leases) != 2 || term.Lease() != keylock.Lease(dl.lease(1)) || !term.Valid() {
		t.Fatalf("%d grants; the term's is the second: %v", len(dl.leases), term.Lease() == keylock.Lease(dl.lease(1)))
	}
	if term.Token() <= dl.lease(0).Token() {
		t.Fatalf("token %d after %d", term.Token(), dl.lease(0).Token())
	}
}

// failingLocker is an in-process Locker whose grants' first Unlock fails
// without releasing (an unreachable engine), and release when the test
// says (the Locker's background retry succeeding).
type failingLocker struct {
	keylock.Locker
	mu     sync.Mutex
	leases []*failingLease
}

func (f *failingLocker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	l, err := f.Locker.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	fl := &failingLease{Lease: l}
	f.mu.Lock()
	f.leases = append(f.leases, fl)
	f.mu.Unlock()
	return fl, nil
}

// Calls is the inner view's: a failingLocker lists.
func (f *failingLocker) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	return f.Locker.(keylock.Lister).Calls(ctx, key)
}

type failingLease struct {
	keylock.Lease
	failed atomic.Bool
}

var errUnreachable = errors.New("engine unreachable")

func (l *failingLease) Unlock(ctx context.Context) error {
	if l.failed.CompareAndSwap(false, true) {
		return errUnreachable
	}
	return nil
}

// release releases the grant, as the Locker's background retry would.
func (l *failingLease) release() { l.Lease.Unlock(context.Background()) }

// TestResignRetried: a Resign whose release fails returns the failure
// with the term's context already ended; a retry reads the key's calls
// and fails while the grant is still held; once it is gone, a retry
// returns nil and the next candidate leads.
func TestResignRetried(t *testing.T) {
	_, inner := newLocker(t, "retry")
	f := &failingLocker{Locker: inner}
	e := elect.New(f, "leader")
	ctx := context.Background()
	term, err := e.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := term.Resign(ctx); !errors.Is(err, errUnreachable) {
		t.Fatalf("Resign: %v, want the release's failure", err)
	}
	if term.Valid() || !errors.Is(context.Cause(term.Context()), elect.ErrResigned) {
		t.Fatal("the term still leads after a failed Resign")
	}
	if err := term.Resign(ctx); err == nil || !strings.Contains(err.Error(), "still held") {
		t.Fatalf("a retry while the grant is held: %v", err)
	}
	next := campaign(t, ctx, e, "b")
	f.mu.Lock()
	l := f.leases[0]
	f.mu.Unlock()
	l.release()
	if err := term.Resign(ctx); err != nil {
		t.Fatalf("a retry once the grant is gone: %v", err)
	}
	b := recv(t, next, "b's term")
	if b.Value() != "b" {
		t.Fatalf("next leader %q", b.Value())
	}
	b.Resign(ctx) // fails, as every first Unlock of a failingLease does
	b.Lease().(*failingLease).release()
}

// TestRun: Run runs fn in each term with the term's context; fn returning
// nil while leading resigns and campaigns again (another candidate queued
// leads meanwhile); an error from fn is returned after the Resign; the
// end of Run's context ends the term and Run.
func TestRun(t *testing.T) {
	fl, l := newLocker(t, "run")
	e := elect.New(l, "leader")
	ctx := context.Background()
	var terms []uint64
	var other *elect.Term
	errStop := errors.New("stop")
	err := e.Run(ctx, "runner", func(ctx context.Context, term *elect.Term) error {
		terms = append(terms, term.Token())
		if owner.LabelOf(ctx) != "runner" {
			t.Errorf("the term's context carries label %q", owner.LabelOf(ctx))
		}
		switch len(terms) {
		case 1:
			ch := campaign(t, context.Background(), e, "other")
			await(t, "other queued", func() bool { return fl.Waiters("leader") == 1 })
			go func() {
				other = <-ch
				other.Resign(context.Background())
			}()
			return nil // resign, and campaign again behind "other"
		default:
			return errStop
		}
	})
	if !errors.Is(err, errStop) || len(terms) != 2 || terms[1] <= terms[0] {
		t.Fatalf("Run: %v after terms %v", err, terms)
	}
	if fl.Len() != 0 {
		t.Fatal("Run returned without resigning")
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		done <- e.Run(rctx, "runner", func(ctx context.Context, term *elect.Term) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	recv(t, started, "the term")
	cancel()
	if err := recv(t, done, "Run's return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after its context ended: %v", err)
	}
	if fl.Len() != 0 {
		t.Fatal("Run returned without resigning")
	}
}

// TestRunPanics: a panic in fn resigns and goes on.
func TestRunPanics(t *testing.T) {
	fl, l := newLocker(t, "panic")
	e := elect.New(l, "leader")
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v", r)
		}
		if fl.Len() != 0 {
			t.Fatal("no Resign after the panic")
		}
	}()
	e.Run(context.Background(), "a", func(context.Context, *elect.Term) error { panic("boom") })
}

// TestCampaignErrors: a value longer than a label fails naming the key;
// a closed Locker fails with ErrClosed; a Locker that cannot list fails
// Leader and Observe with ErrNoListing.
func TestCampaignErrors(t *testing.T) {
	fl, l := newLocker(t, "errors")
	e := elect.New(l, "leader")
	if _, err := e.Campaign(context.Background(), strings.Repeat("x", owner.MaxLabel+1)); err == nil || !strings.Contains(err.Error(), `"leader"`) {
		t.Fatalf("a long value: %v", err)
	}
	plain := elect.New(struct{ keylock.Locker }{l}, "leader")
	if _, err := plain.Leader(context.Background()); !errors.Is(err, elect.ErrNoListing) {
		t.Fatalf("Leader without a listing: %v", err)
	}
	if _, err := plain.Observe(context.Background()); !errors.Is(err, elect.ErrNoListing) {
		t.Fatalf("Observe without a listing: %v", err)
	}
	fl.Close(context.Background())
	if _, err := e.Campaign(context.Background(), "a"); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("Campaign on a closed Locker: %v", err)
	}
}
