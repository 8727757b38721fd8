package pglock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// TestCallsAcrossLockers: Locker.Calls (keylock.Lister) lists a key's
// calls in grant order, whichever Locker made them: the holder with its
// flow's label, its Locker's process and token; the waiter behind it with
// its label and no token. The debug dump of the waiting Locker names the
// holder of the other Locker (the calls ahead).
func TestCallsAcrossLockers(t *testing.T) {
	p, _ := setup(t, 10)
	const prefix = "calls-across"
	holder := newLocker(t, p, prefix, WithName("holding"))
	waiter := newLocker(t, p, prefix, WithName("waiting"), WithDebug())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := holder.Lock(owner.NewLabeledContext(ctx, "req-42"), "k")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	wctx, stop := context.WithCancel(owner.NewLabeledContext(ctx, "req-43"))
	defer stop()
	go func() {
		l, err := waiter.Lock(wctx, "k")
		if err == nil {
			err = l.Unlock(ctx)
		}
		done <- err
	}()
	var calls []keylock.CallInfo
	for {
		calls, err = waiter.Calls(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) == 2 {
			break
		}
		time.Sleep(5 * time.Millisecond) // a poll: the listing decides
	}
	h, w := calls[0], calls[1]
	if h.Label != "req-42" || h.Process != keylock.LocalProcess("holding") || !h.Held || h.Token != g.Token() || h.Mode != keylock.ModeExclusive {
		t.Errorf("the holder: %+v; want req-42 of %+v holding token %d", h, keylock.LocalProcess("holding"), g.Token())
	}
	if w.Label != "req-43" || w.Process != keylock.LocalProcess("waiting") || w.Held || w.Token != 0 {
		t.Errorf("the waiter: %+v", w)
	}
	var b strings.Builder
	if err := debug.Dump(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"holding" "req-42" exclusive token`) {
		t.Errorf("the waiting Locker's dump does not name the holder ahead:\n%s", b.String())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
