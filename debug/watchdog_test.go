package debug_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"go.uber.org/goleak"
)

// capture is a slog.Handler that sends each record's message and
// attributes to a channel.
type capture struct {
	mu      sync.Mutex
	records chan map[string]any
}

func newCapture() *capture { return &capture{records: make(chan map[string]any, 100)} }

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *capture) WithGroup(string) slog.Handler            { return c }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"msg": r.Message, "level": r.Level}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case c.records <- m:
	default: // a full buffer drops; tests read long before that
	}
	return nil
}

func (c *capture) next(t *testing.T, msg string) map[string]any {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case r := <-c.records:
			if r["msg"] == msg {
				return r
			}
		case <-timeout:
			t.Fatalf("no %q warning within a minute", msg)
		}
	}
}

// TestLongHeldWarnings: a key held past d is reported once with key,
// holder, held_for and the stack, again only past 2d, 4d…; a waiter queued
// past d is reported as a long wait; Close stops the watchdog goroutine.
func TestLongHeldWarnings(t *testing.T) {
	const d = 20 * time.Millisecond
	logs := newCapture()
	l := fairlock.New[string](fairlock.WithName("slow"), fairlock.WithLongHeld(d), fairlock.WithStacks(), fairlock.WithLogger(slog.New(logs)))
	ctx := owner.NewContext(context.Background())
	holder, _ := owner.FromContext(ctx)
	g, err := l.Lock(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	waiterCtx := owner.NewContext(context.Background())
	waiter, _ := owner.FromContext(waiterCtx)
	waited := make(chan error, 1)
	go func() {
		g, err := l.Lock(waiterCtx, "stuck")
		if err == nil {
			g.Unlock()
		}
		waited <- err
	}()

	var heldFor []time.Duration
	for range 3 {
		r := logs.next(t, "fairlock: lock held too long")
		if r["level"] != slog.LevelWarn || r["locker"] != "slow" || r["key"] != "stuck" || r["holder"] != holder.String() {
			t.Fatalf("warning %v lacks level/locker/key/holder", r)
		}
		if s, _ := r["stack"].(string); !strings.Contains(s, "TestLongHeldWarnings") {
			t.Fatalf("warning stack %q does not name the acquirer", s)
		}
		heldFor = append(heldFor, r["held_for"].(time.Duration))
	}
	// The n'th warning comes only once the hold passed d·2^(n-1).
	for i, h := range heldFor {
		if limit := d << i; h <= limit {
			t.Errorf("warning %d at held_for %v, before its threshold %v (all: %v)", i+1, h, limit, heldFor)
		}
	}
	r := logs.next(t, "fairlock: waiting too long")
	if r["waiter"] != waiter.String() || r["holder"] != holder.String() || r["waited"].(time.Duration) <= d {
		t.Fatalf("long-wait warning %v", r)
	}
	st := findLocker(t, debug.Snapshot(), "slow")
	if !st.Held[0].LongHeld || !st.Held[0].Waiters[0].LongWait || st.LongHeld != d {
		t.Fatalf("snapshot does not flag the long hold and wait: %+v", st)
	}
	g.Unlock()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t) // the watchdog is gone
}

func TestDoubleUnlockCounted(t *testing.T) {
	l := fairlock.New[string](fairlock.WithName("double"), fairlock.WithDebug())
	defer l.Close(context.Background())
	g, _ := l.Lock(context.Background(), "k")
	g.Unlock()
	g.Unlock()
	g.Unlock()
	if st := findLocker(t, debug.Snapshot(), "double"); st.DoubleUnlocks != 2 {
		t.Fatalf("DoubleUnlocks = %d, want 2", st.DoubleUnlocks)
	}
}
