package etcdtest

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// LockFunc locks one lock under measurement: it blocks until it holds the
// lock (or ctx ends) and returns the function that unlocks it.
type LockFunc func(ctx context.Context) (unlock func(), err error)

// HandOff measures one hand-off to a freshly queued waiter. holder locks;
// waiter calls Lock on a goroutine of its own; as soon as the key range
// queue (a prefix) holds two keys, the holder's and the waiter's, the
// holder unlocks. HandOff returns the time from the holder's unlock to the
// waiter's grant, after unlocking the waiter too. It blocks until then and
// returns the first error of either lock or of the Gets (count-only, on
// client) by which it watches the queue fill; a waiter that fails, or is
// granted, before the queue holds two keys ends the measurement with an
// error.
//
// The lock must write one key per holder or waiter under queue, as
// etcdlock and etcd's concurrency.Mutex do. It measures one lock at a
// time; to compare two locks, interleave calls for each.
func HandOff(ctx context.Context, client *clientv3.Client, holder, waiter LockFunc, queue string) (time.Duration, error) {
	unlock, err := holder(ctx)
	if err != nil {
		return 0, err
	}
	type result struct {
		unlock func()
		at     time.Time
		err    error
	}
	granted := make(chan result, 1)
	go func() {
		u, err := waiter(ctx)
		granted <- result{u, time.Now(), err}
	}()
	for {
		select {
		case r := <-granted: // before the holder let go
			unlock()
			if r.err != nil {
				return 0, r.err
			}
			r.unlock()
			return 0, errors.New("etcdtest: HandOff: the waiter was granted while the holder held the lock")
		default:
		}
		resp, err := client.Get(ctx, queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			unlock()
			if r := <-granted; r.err == nil {
				r.unlock()
			}
			return 0, err
		}
		if resp.Count == 2 {
			break
		}
	}
	start := time.Now()
	unlock()
	r := <-granted
	if r.err != nil {
		return 0, r.err
	}
	r.unlock()
	return r.at.Sub(start), nil
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted, a slice in
// increasing order: the value at rank q·n rounded to the nearest integer
// (at least 1); 0 for an empty slice.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
