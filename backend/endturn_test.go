package backend

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// removals is an Engine that only records the entries removed (Remove,
// RemoveAll) and when: enough for the janitor and Close.
type removals struct {
	mu      sync.Mutex
	removed map[string]time.Time // entry id → when it was removed
}

func (r *removals) Enqueue(context.Context, *Call) (Enqueued, error) { return Enqueued{}, nil }
func (r *removals) Release(context.Context, *Call) (bool, error)     { return true, nil }
func (r *removals) Renew(context.Context, []*Session, int) []Renewal { return nil }
func (r *removals) Shutdown(_ context.Context, left []Entry) ([]Entry, error) {
	return left, nil
}

func (r *removals) Remove(_ context.Context, e Entry) error {
	return r.RemoveAll(context.Background(), e.Key, []Entry{e})
}

func (r *removals) RemoveAll(_ context.Context, _ string, es []Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range es {
		r.removed[e.ID] = time.Now()
	}
	return nil
}

func (r *removals) when(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.removed[id]
	return at, ok
}

// queuedTurn begins a Turn on key "k" in k and leaves it as run leaves a
// confirmed Turn whose entry id is queued, waiting in wait; it returns
// the call and the channel wait's result arrives on.
func queuedTurn(t *testing.T, k *Core, id string) (*Call, <-chan error) {
	t.Helper()
	ctx := context.Background()
	c, err := k.begin(ctx, "k", owner.Of(ctx), Turn, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	c.NameLocked(id)
	c.token, c.confirmed = 5, true
	k.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		err := k.wait(ctx, c, nil)
		k.finish(c, err)
		done <- err
	}()
	return c, done
}

// TestEndTurnLeavesItsEntryForLater: a Turn that the engine ends in its
// dispatch (EndTurnLocked) returns nil with its books closed, and its
// entry is removed by the janitor once turnRemovalDelay has passed, not
// at once: the removals of the Turns one release frees come after the
// hand-offs it causes. A second EndTurnLocked, or one for a call that is
// not a Turn, changes nothing.
func TestEndTurnLeavesItsEntryForLater(t *testing.T) {
	r := &removals{removed: make(map[string]time.Time)}
	k := New(Config{Package: "backendtest", Kind: "backendtest.Locker", DefaultName: "backendtest"}, NewSettings(nil))
	k.Start(r)
	defer k.Close(context.Background())
	c, done := queuedTurn(t, k, "e1")
	k.mu.Lock()
	ended := time.Now()
	if !k.EndTurnLocked(c) {
		k.mu.Unlock()
		t.Fatal("EndTurnLocked of a queued Turn: false, want true")
	}
	if k.EndTurnLocked(c) {
		k.mu.Unlock()
		t.Fatal("second EndTurnLocked: true, want false")
	}
	k.mu.Unlock()
	if err := recvWithin(t, done, 10*time.Second); err != nil {
		t.Fatalf("Wait: %v, want nil", err)
	}
	k.mu.Lock()
	calls, grants, keys := k.calls, k.grants, len(k.keys)
	k.mu.Unlock()
	if calls != 0 || grants != 0 || keys != 0 {
		t.Fatalf("after the Turn returned: %d calls, %d grants, %d keys in the books; want none", calls, grants, keys)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		at, ok := r.when("e1")
		if ok {
			if at.Sub(ended) < turnRemovalDelay {
				t.Fatalf("entry removed %v after its Turn ended, want at least %v", at.Sub(ended), turnRemovalDelay)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("entry of the ended Turn not removed after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCloseRemovesEntriesLeftForLater: Close removes the entries of
// Turns that the janitor left for later, before it returns, however
// recently they ended.
func TestCloseRemovesEntriesLeftForLater(t *testing.T) {
	r := &removals{removed: make(map[string]time.Time)}
	k := New(Config{Package: "backendtest", Kind: "backendtest.Locker", DefaultName: "backendtest"}, NewSettings(nil))
	k.Start(r)
	c, done := queuedTurn(t, k, "e2")
	k.mu.Lock()
	k.EndTurnLocked(c)
	k.mu.Unlock()
	if err := recvWithin(t, done, 10*time.Second); err != nil {
		t.Fatalf("Wait: %v, want nil", err)
	}
	if err := k.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, ok := r.when("e2"); !ok {
		t.Fatal("Close returned with the ended Turn's entry not removed")
	}
}

// TestEndTurnRefusesOtherCalls: EndTurnLocked ends only a confirmed
// Turn still queued: an exclusive call is left to GrantLocked.
func TestEndTurnRefusesOtherCalls(t *testing.T) {
	k := New(Config{Package: "backendtest", Kind: "backendtest.Locker", DefaultName: "backendtest"}, NewSettings(nil))
	defer k.Abort()
	ctx := context.Background()
	c, err := k.begin(ctx, "k", owner.Of(ctx), Exclusive, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	c.NameLocked("e3")
	c.token, c.confirmed = 5, true
	if k.EndTurnLocked(c) {
		t.Fatal("EndTurnLocked of an exclusive call: true, want false")
	}
	if c.state != queued || c.turnDone.Load() {
		t.Fatalf("exclusive call after EndTurnLocked: state %v, turnDone %v; want queued and not done", c.state, c.turnDone.Load())
	}
}
