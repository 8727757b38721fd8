package etcdlock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease renewal. A Locker has one lease at a time; every key it writes is
// attached to it. The lease loop renews it with one KeepAliveOnce every
// third of its TTL and keeps the lease's deadline: the send time of the
// last successful renewal plus the TTL the server granted, less a tenth.
// The server cannot have expired the lease before that instant, as long
// as the two clocks run at rates within 10% of each other; the renewal's
// send time, not its reply's arrival, starts the count.
//
// Each renewal attempt has its own bound, renewBound(TTL), a sixth of the
// TTL: an attempt whose connection leads to a member that no longer
// answers (a host gone from the network without resetting its
// connections: nothing fails, nothing arrives) is given up after that
// bound and retried at once, with two renewals sent together. The client
// balances its requests round-robin over its connections (the gRPC
// round_robin policy clientv3 sets), so the retries go out on other
// connections where the client has them, and a lease is abandoned only
// when no attempt reached a member of a quorum from a third of the TTL to
// its deadline: several rounds, since that window is 0.57 TTL long. After
// a fast failure (an error, not the bound) the next attempt waits a tenth
// of the TTL.
//
// The lease is abandoned when the server says it is gone (revoked or
// expired: ErrLeaseNotFound), when a write with it fails that way, or when
// its deadline passes without a renewal. Then every grant on it is lost
// (Lost closes), every queued call on it queues again under the next
// lease (its place is gone with its key), the old lease is revoked in the
// background (retried for up to twice the TTL: its keys go as soon as the
// server is reachable, else when it expires), and the loop grants a new
// lease for later calls: the Locker does not die with its session.

// leaseKeeper keeps a Locker's lease: it grants it, renews it, and
// replaces it when it is lost (loop), and gives calls the current one
// (current). New sets the fields that come from the Locker; they do not
// change after.
type leaseKeeper struct {
	mu      *sync.Mutex // the Locker's mu: guards cur and ch, and each lease's dead and abandoned
	client  *clientv3.Client
	ttl     time.Duration   // asked of the server: the option rounded up to whole seconds
	closing context.Context // the Locker's: ends when Close begins
	bg      context.Context // the Locker's background context: ends the loop
	wg      *sync.WaitGroup // the Locker's background goroutines
	logger  *slog.Logger
	name    string // the Locker's name, for the log

	// lost is called, with mu held, when the loop abandons ls: the
	// Locker loses the calls written with it (Locker.loseLease).
	lost func(ls *lease)

	cur *lease        // guarded by mu: the current lease; nil while a new one is granted
	ch  chan struct{} // guarded by mu: closed once cur is set
}

// lease is one etcd lease of a Locker.
type lease struct {
	id   clientv3.LeaseID
	ttl  time.Duration // as granted by the server
	sent time.Time     // when the Grant was sent: the first deadline's start
	kill chan struct{} // closed by leaseKeeper.failed: abandon the lease now
	dead bool          // guarded by Locker.mu: kill is closed

	// abandoned is guarded by Locker.mu: the Locker gave the lease up (a
	// write found it gone, or its deadline passed, or the server said it
	// expired) and lost its grants; an Unlock that runs meanwhile and
	// cannot delete its key reports ErrLost.
	abandoned bool
}

// renewBound is how long one renewal attempt (or one Grant attempt, at
// first) may take before it is given up and retried, for a lease of
// TTL ttl: a sixth of it, and at least 250 ms.
func renewBound(ttl time.Duration) time.Duration {
	return max(ttl/6, 250*time.Millisecond)
}

// grant asks the server for a new lease.
func (k *leaseKeeper) grant(ctx context.Context) (*lease, error) {
	sent := time.Now()
	resp, err := k.client.Grant(ctx, int64(k.ttl/time.Second))
	if err != nil {
		return nil, err
	}
	return &lease{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, sent: sent, kill: make(chan struct{})}, nil
}

// current returns the lease a call should write with, waiting for a new
// one while the last is being replaced. It fails with the context's error
// or ErrClosed.
func (k *leaseKeeper) current(ctx context.Context) (*lease, error) {
	for {
		k.mu.Lock()
		if k.closing.Err() != nil {
			k.mu.Unlock()
			return nil, errClosed
		}
		ls, ch := k.cur, k.ch
		k.mu.Unlock()
		if ls != nil {
			return ls, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxerr.Of(ctx)
		case <-k.closing.Done():
			return nil, errClosed
		}
	}
}

// failed makes the lease loop abandon ls now: a write with it found it
// gone. Calls wait for the next lease from here on.
func (k *leaseKeeper) failed(ls *lease) {
	k.mu.Lock()
	if !ls.dead {
		ls.dead = true
		close(ls.kill)
	}
	ls.abandoned = true
	if k.cur == ls {
		k.cur = nil
		k.ch = make(chan struct{})
	}
	k.mu.Unlock()
}

// loop renews the Locker's lease and replaces it when it is lost, until
// k.bg ends. It runs in its own goroutine.
func (k *leaseKeeper) loop() {
	defer k.wg.Done()
	k.mu.Lock()
	ls := k.cur
	k.mu.Unlock()
	for {
		why := k.keepAlive(ls)
		if k.bg.Err() != nil {
			return
		}
		k.logger.Warn("etcdlock: lease lost; its grants are lost, its queued calls queue again under a new lease",
			"locker", k.name, "lease", int64(ls.id), "reason", why)
		k.mu.Lock()
		ls.abandoned = true
		if k.cur == ls {
			k.cur = nil
			k.ch = make(chan struct{})
		}
		k.lost(ls)
		k.mu.Unlock()
		old := ls
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.revokeAbandoned(old)
		}()
		retry := newBackoff()
		// Each Grant attempt is bounded, from twice renewBound doubling
		// to cleanupTimeout: one that went to a member that no longer
		// answers is retried, on the client's next connection, soon; a
		// slow quorum gets longer each time.
		bound := 2 * renewBound(k.ttl)
		for {
			ctx, cancel := context.WithTimeout(k.bg, bound)
			next, err := k.grant(ctx)
			cancel()
			if err == nil {
				ls = next
				break
			}
			if k.bg.Err() != nil {
				return
			}
			k.logger.Warn("etcdlock: lease grant failed; retrying", "locker", k.name, "error", err)
			bound = min(2*bound, cleanupTimeout)
			if !retry.wait(k.bg) {
				return
			}
		}
		k.mu.Lock()
		k.cur = ls
		close(k.ch)
		k.mu.Unlock()
	}
}

// keepAlive renews ls until it is lost, and says why; or until k.bg ends.
// It wakes for the next renewal or for the deadline, whichever is first,
// so that the lease is given up at its deadline, not a retry later. Each
// attempt is bounded by renewBound and by the deadline.
func (k *leaseKeeper) keepAlive(ls *lease) string {
	deadline := ls.sent.Add(ls.ttl - ls.ttl/10)
	next := ls.sent.Add(ls.ttl / 3)
	bound := renewBound(ls.ttl)
	hedge := 1 // renewals sent at once: two after one hung
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		t.Reset(min(time.Until(next), time.Until(deadline)))
		select {
		case <-t.C:
		case <-ls.kill:
			return "a write found it gone"
		case <-k.bg.Done():
			return ""
		}
		now := time.Now()
		if !now.Before(deadline) {
			return "not renewed for its TTL"
		}
		if now.Before(next) {
			continue
		}
		end := now.Add(bound)
		if deadline.Before(end) {
			end = deadline
		}
		ctx, cancel := context.WithDeadline(k.bg, end)
		resp, err := k.renew(ctx, ls.id, hedge)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			deadline = now.Add(ttl - ttl/10)
			next = now.Add(ttl / 3)
			hedge = 1
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			return "expired or revoked"
		case time.Since(now) >= bound:
			// The attempt hung (a member that does not answer): retry
			// at once, with two renewals that go out on two of the
			// client's connections.
			next = time.Now()
			hedge = 2
		default:
			next = time.Now().Add(ls.ttl / 10)
		}
	}
}

// renew sends n renewals of id at once (each on the connection the
// client's balancer picks next) and returns the first answer that
// settles it: a renewal, or the server's word that the lease is gone;
// else, once all have failed, the last error. It cancels and waits for
// the others.
func (k *leaseKeeper) renew(ctx context.Context, id clientv3.LeaseID, n int) (*clientv3.LeaseKeepAliveResponse, error) {
	if n <= 1 {
		return k.client.KeepAliveOnce(ctx, id)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		resp *clientv3.LeaseKeepAliveResponse
		err  error
	}
	got := make(chan result, n)
	for range n {
		go func() {
			resp, err := k.client.KeepAliveOnce(ctx, id)
			got <- result{resp, err}
		}()
	}
	var settled *result
	var last error
	for range n {
		r := <-got
		switch {
		case settled == nil && (r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound)):
			settled = &r
			cancel()
		case r.err != nil:
			last = r.err
		}
	}
	if settled != nil {
		return settled.resp, settled.err
	}
	return nil, last
}

// revokeAbandoned revokes a lease the Locker gave up, so that the keys
// still attached to it (grants lost to a renewal deadline while etcd was
// unreachable, say) do not keep others waiting until it expires. It
// retries until the revoke succeeds, for at most twice the TTL (by then
// the lease has expired on the server, unless a new leader extended it),
// or until the Locker closes.
func (k *leaseKeeper) revokeAbandoned(ls *lease) {
	giveUp := time.Now().Add(2 * ls.ttl)
	retry := newBackoff()
	for {
		// On the background context: Close ends a try in progress (it
		// waits for this goroutine), and its own revoke takes over.
		ctx, cancel := context.WithTimeout(k.bg, cleanupTimeout)
		err := k.revokeWith(ctx, ls)
		cancel()
		if err == nil || !time.Now().Before(giveUp) || !retry.wait(k.bg) {
			return
		}
	}
}

// revoke revokes ls on a detached context bounded by cleanupTimeout,
// deleting every key attached to it.
func (k *leaseKeeper) revoke(ls *lease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.client.Ctx()), cleanupTimeout)
	defer cancel()
	return k.revokeWith(ctx, ls)
}

// revokeWith revokes ls on ctx; a lease already gone is not an error.
func (k *leaseKeeper) revokeWith(ctx context.Context, ls *lease) error {
	_, err := k.client.Revoke(ctx, ls.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}
