package pglock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestManyWaitersFewConnections queues 500 calls on one key, from 5
// sessions over one pool of at most 10 connections, behind a holder, and
// checks that while they wait no connection of the pool is in use and the
// server has at most 11 of the test's (the pool's and the listener's),
// and that, woken only by notices, they are granted one at a time in the
// order of their tokens (their queue order).
func TestManyWaitersFewConnections(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 10)
	d := dispatch(t, pool, s)
	sessions := make([]int64, 5)
	for i := range sessions {
		sessions[i] = newSession(t, pool, s, testTTL)
	}
	holder, _, _ := mustEnqueue(t, pool, s, "k", sessions[0], modeExclusive, 0, 0, false)

	const waiters = 500
	var mu sync.Mutex
	var order []int64 // tokens, in the order their calls were granted
	holding := 0
	inQueue := make(chan struct{}, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := callRef{Session: sessions[i%len(sessions)], Seq: seqs.Add(1)}
			ch := d.expect(ref)
			out, token, _, err := enqueue(ctx, pool, s, "k", call{ref: ref, mode: modeExclusive}, false)
			if err != nil || out != queued {
				t.Errorf("enqueue: %v %v", out, err)
				inQueue <- struct{}{}
				return
			}
			inQueue <- struct{}{}
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
				t.Errorf("call %v (token %d): no grant within 60 s", ref, token)
				return
			}
			mu.Lock()
			order = append(order, token)
			holding++
			if holding != 1 {
				t.Errorf("call %v holds beside %d others", ref, holding-1)
			}
			holding--
			mu.Unlock()
			if _, _, err := release(ctx, pool, s, "k", ref); err != nil {
				t.Error(err)
			}
		}()
	}
	for range waiters {
		<-inQueue
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections of the pool in use while every call waits", n)
	}
	var conns int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, t.Name()).Scan(&conns); err != nil {
		t.Fatal(err)
	}
	if conns > 11 {
		t.Errorf("%d server connections for 500 waiters, want at most 11", conns)
	}
	calls, _, err := readKey(ctx, pool, s, "k", 0)
	if err != nil || calls != waiters+1 {
		t.Fatalf("%d calls on the key (%v), want %d", calls, err, waiters+1)
	}

	mustRelease(t, pool, s, "k", holder)
	wg.Wait()
	if len(order) != waiters {
		t.Fatalf("%d of %d calls granted", len(order), waiters)
	}
	if !slices.IsSorted(order) {
		t.Errorf("grants out of token order: %v", order)
	}
	t.Logf("%d calls granted in order, on %d server connections", len(order), conns)
}
