package keylock_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// waitQueued polls until key has n waiters in l, failing t after 10 s.
func waitQueued(t *testing.T, l *fairlock.Locker[string], key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Waiters(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters on %q, want %d", l.Waiters(key), key, n)
		}
		runtime.Gosched()
	}
}

// TestInProcessCalls: the in-process view lists a key's holders in grant
// order, then its waiters in queue order, each with its flow's label,
// mode, token (holders only) and this process, named by the Locker.
func TestInProcessCalls(t *testing.T) {
	for _, debug := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "debug"}[debug], func(t *testing.T) {
			opts := []fairlock.Option{fairlock.WithName("calls-test")}
			if debug {
				opts = append(opts, fairlock.WithDebug())
			}
			fl := fairlock.New[string](opts...)
			defer fl.Close(context.Background())
			l := keylock.InProcess(fl)
			ls, ok := l.(keylock.Lister)
			if !ok {
				t.Fatal("the in-process view is no Lister")
			}
			ctx := context.Background()
			if calls, err := ls.Calls(ctx, "k"); err != nil || calls != nil {
				t.Fatalf("a free key: %v, %v; want nil, nil", calls, err)
			}
			a, b := owner.NewLabeledContext(ctx, "reader-a"), owner.NewLabeledContext(ctx, "reader-b")
			ra, err := l.RLock(a, "k")
			if err != nil {
				t.Fatal(err)
			}
			rb, err := l.RLock(b, "k")
			if err != nil {
				t.Fatal(err)
			}
			w := owner.NewLabeledContext(ctx, "writer")
			done := make(chan error, 2)
			go func() {
				g, err := l.Lock(w, "k")
				if err == nil {
					err = g.Unlock(ctx)
				}
				done <- err
			}()
			waitQueued(t, fl, "k", 1)
			go func() { done <- l.Wait(owner.NewContext(ctx), "k") }()
			waitQueued(t, fl, "k", 2)

			calls, err := ls.Calls(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			me := keylock.LocalProcess("calls-test")
			if me.PID != os.Getpid() {
				t.Fatalf("LocalProcess: %+v", me)
			}
			want := []keylock.CallInfo{
				{Label: "reader-a", Process: me, Mode: keylock.ModeShared, Held: true, Token: ra.Token()},
				{Label: "reader-b", Process: me, Mode: keylock.ModeShared, Held: true, Token: rb.Token()},
				{Label: "writer", Process: me, Mode: keylock.ModeExclusive},
				{Process: me, Mode: keylock.ModeWait},
			}
			if diff := cmp.Diff(want, calls, cmpopts.IgnoreFields(keylock.CallInfo{}, "Age")); diff != "" {
				t.Errorf("Calls (-want +got):\n%s", diff)
			}
			for _, c := range calls {
				if (c.Age > 0) != debug {
					t.Errorf("%+v: an age with debug %v", c, debug)
				}
			}
			ra.Unlock(ctx)
			rb.Unlock(ctx)
			for range 2 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			if calls, err := ls.Calls(ctx, "k"); err != nil || calls != nil {
				t.Fatalf("after the last release: %v, %v; want nil, nil", calls, err)
			}
		})
	}
}

// TestInProcessSemaphoreCalls: a Semaphore's listing gives each call's
// units.
func TestInProcessSemaphoreCalls(t *testing.T) {
	fs := fairlock.NewSemaphore[string](3, fairlock.WithName("sem-calls"))
	defer fs.Close(context.Background())
	s := keylock.InProcessSemaphore(fs)
	ctx := context.Background()
	g, err := s.Acquire(owner.NewLabeledContext(ctx, "two"), "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock(ctx)
	calls, err := s.(keylock.Lister).Calls(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	want := []keylock.CallInfo{{Label: "two", Process: keylock.LocalProcess("sem-calls"), Mode: keylock.ModeUnits, Units: 2, Held: true, Token: g.Token()}}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("Calls (-want +got):\n%s", diff)
	}
}

// TestInProcessCallsDoneContext: a done context fails the listing with
// the context's error, naming the key.
func TestInProcessCallsDoneContext(t *testing.T) {
	fl := fairlock.New[string]()
	defer fl.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := keylock.InProcess(fl).(keylock.Lister).Calls(ctx, "k")
	var le *fairlock.LockError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &le) || le.Key != "k" || le.Op != "Calls" {
		t.Fatalf("Calls with a done context: %v", err)
	}
}

// TestProcessString: a Process reads host:pid and the Locker's name,
// quoted.
func TestProcessString(t *testing.T) {
	p := keylock.Process{Host: "web-2", PID: 42, Locker: "a\nb"}
	if got, want := p.String(), `web-2:42 "a\nb"`; got != want {
		t.Fatalf("String: %q, want %q", got, want)
	}
}
