package pglock

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDeadSessionPurge checks that the rows of a session that expired by
// the server's clock are purged by the next statement on their key, all
// at once, wherever they are in the queue, and that the calls the purge
// grants are announced: here by a read (the Locker's timer) and by an
// enqueue of someone else.
func TestDeadSessionPurge(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	dead := newSession(t, pool, s, testTTL)
	live := newSession(t, pool, s, testTTL)

	for _, by := range []string{"read", "enqueue"} {
		key := "k-" + by
		mustEnqueue(t, pool, s, key, dead, modeExclusive, 0, 0, false) // holder
		w1, _, _ := mustEnqueue(t, pool, s, key, live, modeShared, 0, 0, false)
		mustEnqueue(t, pool, s, key, dead, modeShared, 0, 0, false) // a queued call of the dead session, between live ones
		w2, _, _ := mustEnqueue(t, pool, s, key, live, modeShared, 0, 0, false)
		if got := grantedRefs(t, pool, s, key); len(got) != 1 || got[0].Session != dead {
			t.Fatalf("%s: grants before the expiry: %v", by, got)
		}
		n.take()
		expire(t, pool, dead)
		// Nothing happens until a statement meets the rows.
		if got := grantedRefs(t, pool, s, key); !slices.Equal(got, []callRef{w1, w2}) {
			t.Errorf("%s: listCalls, which computes over live rows, shows grants %v, want %v", by, got, []callRef{w1, w2})
		}
		switch by {
		case "read":
			calls, mine, err := readKey(ctx, pool, s, key, live)
			if err != nil {
				t.Fatal(err)
			}
			want := []callState{{Seq: w1.Seq, Granted: true}, {Seq: w2.Seq, Granted: true}}
			if diff := cmp.Diff(want, mine, cmp.Comparer(func(a, b callState) bool { return a.Seq == b.Seq && a.Granted == b.Granted })); calls != 2 || diff != "" {
				t.Errorf("readKey after the expiry: %d calls, mine (-want +got):\n%s", calls, diff)
			}
		case "enqueue":
			mustEnqueue(t, pool, s, key, live, modeExclusive, 0, 0, false)
		}
		got := n.await(t, w1, w2)
		if diff := cmp.Diff([]callRef{w1, w2}, got); diff != "" {
			t.Errorf("%s: notices (-want +got):\n%s", by, diff)
		}
		calls, err := listCalls(ctx, pool, s, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range calls {
			if c.Ref.Session == dead {
				t.Errorf("%s: the dead session's call %v is still on the key", by, c.Ref)
			}
		}
		// The dead session is never renewed again.
		dead = newSession(t, pool, s, testTTL)
	}
}

// TestSessionExpiresByServerClock checks liveness with a real TTL: a
// renewed session keeps its grant past its TTL; one that is not renewed
// loses it, by the server's clock, and the next call is granted by the
// purge that meets it.
func TestSessionExpiresByServerClock(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	const ttl = time.Second
	holder := newSession(t, pool, s, ttl)
	waiter := newSession(t, pool, s, testTTL)
	h, _, _ := mustEnqueue(t, pool, s, "k", holder, modeExclusive, 0, 0, false)
	w, _, _ := mustEnqueue(t, pool, s, "k", waiter, modeExclusive, 0, 0, false)

	// Renewed every TTL/3 for two TTLs, the grant stays.
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); <-tick.C {
		alive, missing, err := renewSession(ctx, pool, holder, []int64{h.Seq})
		if err != nil || !alive || len(missing) != 0 {
			t.Fatalf("renew: %v %v %v", alive, missing, err)
		}
		if _, mine, err := readKey(ctx, pool, s, "k", waiter); err != nil || len(mine) != 1 || mine[0].Granted {
			t.Fatalf("the waiter while the holder renews: %v %v", mine, err)
		}
	}
	// Not renewed, it expires within the TTL by the server's clock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, mine, err := readKey(ctx, pool, s, "k", waiter)
		if err != nil {
			t.Fatal(err)
		}
		if len(mine) == 1 && mine[0].Granted && mine[0].Seq == w.Seq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter was not granted after the holder stopped renewing")
		}
		time.Sleep(ttl / 10)
	}
	alive, _, err := renewSession(ctx, pool, holder, []int64{h.Seq})
	if err != nil || alive {
		t.Errorf("renewal of an expired session: alive %v, %v; want false (an expired session never comes back)", alive, err)
	}
}

// TestRenewReportsMissing checks that a renewal names the calls of the
// session that someone else removed, and not those still there.
func TestRenewReportsMissing(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	a, _, _ := mustEnqueue(t, pool, s, "a", sess, modeExclusive, 0, 0, false)
	b, _, _ := mustEnqueue(t, pool, s, "b", sess, modeExclusive, 0, 0, false)
	if _, err := pool.Exec(ctx, `DELETE FROM fairlock_calls WHERE session = $1 AND seq = $2`, sess, b.Seq); err != nil {
		t.Fatal(err)
	}
	alive, missing, err := renewSession(ctx, pool, sess, []int64{a.Seq, b.Seq})
	if err != nil || !alive || !slices.Equal(missing, []int64{b.Seq}) {
		t.Errorf("renew: alive %v, missing %v, %v; want true, [%d], nil", alive, missing, err, b.Seq)
	}
	alive, missing, err = renewSession(ctx, pool, sess, nil)
	if err != nil || !alive || len(missing) != 0 {
		t.Errorf("renew with no calls: %v %v %v", alive, missing, err)
	}
}

// TestListCalls checks what a listing says of each call: who made it
// (label, Locker name, host, pid), its mode and units, its token, whether
// it holds the key, and whether its session is alive.
func TestListCalls(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	a := newSession(t, pool, s, testTTL)
	b := newSession(t, pool, s, testTTL)
	ra, _, ta := mustEnqueue(t, pool, s, "k", a, modeUnits, 2, 3, false)
	rb, _, tb := mustEnqueue(t, pool, s, "k", b, modeUnits, 2, 3, false)
	expire(t, pool, b)
	calls, err := listCalls(ctx, pool, s, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 {
		t.Fatalf("%d calls, want 2", len(calls))
	}
	want := []callInfo{
		{Token: ta, Ref: ra, Mode: modeUnits, Weight: 2, Size: 3, Label: "label-u", Alive: true, Name: t.Name(), Host: "testhost", PID: os.Getpid(), Granted: true},
		{Token: tb, Ref: rb, Mode: modeUnits, Weight: 2, Size: 3, Label: "label-u", Alive: false, Name: t.Name(), Host: "testhost", PID: os.Getpid(), Granted: false},
	}
	for i := range calls {
		if calls[i].Age < 0 || calls[i].Age > time.Minute {
			t.Errorf("call %d: age %v", i, calls[i].Age)
		}
		calls[i].Age = 0
	}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("listCalls (-want +got):\n%s", diff)
	}
}

// TestSweep checks that a sweep purges the dead rows of keys nobody
// touches, announcing the grants, and deletes the expired sessions.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	dead := newSession(t, pool, s, testTTL)
	live := newSession(t, pool, s, testTTL)
	mustEnqueue(t, pool, s, "a", dead, modeExclusive, 0, 0, false)
	mustEnqueue(t, pool, s, "b", dead, modeExclusive, 0, 0, false)
	w, _, _ := mustEnqueue(t, pool, s, "b", live, modeExclusive, 0, 0, false)
	expire(t, pool, dead)
	swept, err := sweep(ctx, pool, s, 100)
	if err != nil || swept != 2 {
		t.Fatalf("sweep: %d keys, %v; want 2", swept, err)
	}
	n.await(t, w)
	for _, key := range []string{"a", "b"} {
		calls, _ := listCalls(ctx, pool, s, key)
		for _, c := range calls {
			if c.Ref.Session == dead {
				t.Errorf("key %s: dead call %v left", key, c.Ref)
			}
		}
	}
	var sessions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fairlock_sessions WHERE id = $1`, dead).Scan(&sessions); err != nil || sessions != 0 {
		t.Errorf("the expired session's row: %d, %v; want gone", sessions, err)
	}
	if err := endSession(ctx, pool, live); err != nil {
		t.Fatal(err)
	}
	if held, _ := locked(ctx, pool, s, "b"); held {
		t.Error("a call of an ended session still holds its key")
	}
}
