package etcdlock

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Leases: a Locker's session in etcd. A Locker has one lease at a time;
// every key it writes is attached to it. The kit (package backend)
// renews it every third of its TTL through Renew below, one KeepAliveOnce
// per round, and keeps its deadline: the send time of the last successful
// renewal plus the TTL the server granted, less a tenth. Each round is
// bounded by a sixth of the TTL (at least 250 ms): a renewal whose
// connection leads to a member that no longer answers (a host gone from
// the network without resetting its connections) is given up after that
// bound and retried at once, with two renewals sent together. The client
// balances its requests round-robin over its connections (the gRPC
// round_robin policy clientv3 sets), so the retries go out on other
// connections where the client has them, and a lease is lost only when no
// attempt reached a member of a quorum from a third of the TTL to its
// deadline: several rounds, since that window is 0.57 TTL long.
//
// The lease ends when the server says it is gone (revoked or expired:
// ErrLeaseNotFound), when a write with it fails that way, or when its
// deadline passes without a renewal. Then every grant on it is lost (Lost
// closes), every queued call on it queues again under the next lease (its
// place is gone with its key), the old lease is revoked in the background
// (retried for up to twice the TTL: its keys go as soon as the server is
// reachable, else when it expires), and the keeper grants a new lease for
// later calls: the Locker does not die with its session.

// leaseKeeper keeps a Locker's lease: it grants it, hands the current one
// to calls (current), and replaces it when it ends (loop). New sets the
// fields that come from the Locker; they do not change after.
type leaseKeeper struct {
	mu     *sync.Mutex // the Core's mutex: guards cur, s and ch
	k      *backend.Core
	client *clientv3.Client
	ttl    time.Duration // asked of the server: the option rounded up to whole seconds

	cur     *lease           // guarded by mu: the current lease; nil while a new one is granted
	s       *backend.Session // guarded by mu: cur's session
	ch      chan struct{}    // guarded by mu: closed once cur is set
	replace chan struct{}    // cap 1: the current lease ended; grant another
	ended   []*lease         // guarded by mu: leases to revoke
}

// lease is one etcd lease of a Locker: a session's data.
type lease struct {
	id   clientv3.LeaseID
	ttl  time.Duration // as granted by the server
	sent time.Time     // when the Grant was sent: the first deadline's start
}

// grant asks the server for a new lease and records it as the current
// session.
func (lk *leaseKeeper) grant(ctx context.Context) error {
	sent := time.Now()
	resp, err := lk.client.Grant(ctx, int64(lk.ttl/time.Second))
	if err != nil {
		return err
	}
	ls := &lease{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, sent: sent}
	s := lk.k.StartSession(strconv.FormatUint(uint64(ls.id), 16), sent, ls.ttl)
	lk.mu.Lock()
	s.SetData(ls)
	lk.cur, lk.s = ls, s
	close(lk.ch)
	lk.mu.Unlock()
	return nil
}

// current returns the lease a call should write with, and its session,
// waiting for a new one while the last is being replaced. It fails with
// the context's error or ErrClosed.
func (lk *leaseKeeper) current(ctx context.Context) (*backend.Session, *lease, error) {
	closing := lk.k.Closing()
	for {
		lk.mu.Lock()
		if closing.Err() != nil {
			lk.mu.Unlock()
			return nil, nil, errClosed
		}
		ls, s, ch := lk.cur, lk.s, lk.ch
		lk.mu.Unlock()
		if ls != nil {
			return s, ls, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctxerr.Of(ctx)
		case <-closing.Done():
			return nil, nil, errClosed
		}
	}
}

// failed ends s: a write with its lease found it gone.
func (lk *leaseKeeper) failed(s *backend.Session) {
	lk.mu.Lock()
	lk.k.EndSessionLocked(s)
	lk.mu.Unlock()
}

// endedLocked is the engine's SessionEndedLocked: the lease of s is given
// up; if it is the current one, calls wait for the next, which loop
// grants, and it is revoked in the background. mu is held.
func (lk *leaseKeeper) endedLocked(s *backend.Session) {
	ls, _ := s.Data().(*lease)
	if ls == nil {
		return
	}
	lk.ended = append(lk.ended, ls)
	if lk.cur == ls {
		lk.cur, lk.s = nil, nil
		lk.ch = make(chan struct{})
	}
	select {
	case lk.replace <- struct{}{}:
	default:
	}
}

// loop revokes the leases that ended and grants a new one when the
// current one ended, until the background context ends. It runs in its
// own goroutine.
func (lk *leaseKeeper) loop() {
	bg := lk.k.Background()
	for {
		select {
		case <-lk.replace:
		case <-bg.Done():
			return
		}
		lk.mu.Lock()
		old := lk.ended
		lk.ended = nil
		need := lk.cur == nil
		lk.mu.Unlock()
		for _, ls := range old {
			lk.k.Go(func() { lk.revokeEnded(ls) })
		}
		if !need {
			continue
		}
		retry := backend.NewBackoff()
		// Each Grant attempt is bounded, from twice renewBound doubling
		// to CleanupTimeout: one that went to a member that no longer
		// answers is retried, on the client's next connection, soon; a
		// slow quorum gets longer each time.
		bound := 2 * renewBound(lk.ttl)
		for {
			ctx, cancel := context.WithTimeout(bg, bound)
			err := lk.grant(ctx)
			cancel()
			if err == nil {
				break
			}
			if bg.Err() != nil {
				return
			}
			lk.k.Logger().Warn("etcdlock: lease grant failed; retrying", "locker", lk.k.Name(), "error", err)
			bound = min(2*bound, backend.CleanupTimeout)
			if !retry.Wait(bg) {
				return
			}
		}
	}
}

// renew sends n renewals of id at once and returns the first answer that
// settles it: a renewal, or the server's word that the lease is gone;
// else, once all have failed, the last error. It cancels and waits for
// the others.
func (lk *leaseKeeper) renew(ctx context.Context, id clientv3.LeaseID, n int) (*clientv3.LeaseKeepAliveResponse, error) {
	if n <= 1 {
		return lk.client.KeepAliveOnce(ctx, id)
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
			resp, err := lk.client.KeepAliveOnce(ctx, id)
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

// revokeEnded revokes a lease the Locker gave up, so that the keys still
// attached to it (grants lost to a renewal deadline while etcd was
// unreachable, say) do not keep others waiting until it expires. It
// retries until the revoke succeeds, for at most twice the TTL (by then
// the lease has expired on the server, unless a new leader extended it),
// or until the Locker closes.
func (lk *leaseKeeper) revokeEnded(ls *lease) {
	bg := lk.k.Background()
	giveUp := time.Now().Add(2 * ls.ttl)
	retry := backend.NewBackoff()
	for {
		// On the background context: Close ends a try in progress (it
		// waits for this goroutine), and its own revoke takes over.
		ctx, cancel := context.WithTimeout(bg, backend.CleanupTimeout)
		err := lk.revokeWith(ctx, ls)
		cancel()
		if err == nil || !time.Now().Before(giveUp) || !retry.Wait(bg) {
			return
		}
	}
}

// revokeWith revokes ls on ctx; a lease already gone is not an error.
func (lk *leaseKeeper) revokeWith(ctx context.Context, ls *lease) error {
	_, err := lk.client.Revoke(ctx, ls.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// probeTimeout bounds each endpoint's dial in grantFirst.
const probeTimeout = 3 * time.Second

// grantFirst grants the Locker's first lease, or fails with the cause
// when no endpoint can be dialled. The etcd client dials in the
// background and retries a request that finds no connection until the
// request's context ends, so against an unreachable cluster New would
// wait for its whole bound and return only "context deadline exceeded":
// grantFirst races the grant with a plain TCP dial of every endpoint
// (backend.Reachable) and gives up at once with the dials' errors.
func grantFirst(ctx context.Context, lk *leaseKeeper, endpoints []string) error {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	granted := make(chan error, 1)
	go func() { granted <- lk.grant(gctx) }()
	unreachable := make(chan error, 1)
	go func() { unreachable <- backend.Reachable(gctx, endpoints, probeTimeout) }()
	select {
	case err := <-granted:
		return err
	case err := <-unreachable:
		if err == nil {
			return <-granted // an endpoint answers: the grant decides
		}
		cancel()
		if gerr := <-granted; gerr == nil {
			return nil // granted all the same, just in time
		}
		return err
	}
}

// renewBound is how long one Grant attempt may take at first before it
// is given up and retried: a sixth of the TTL, and at least 250 ms (the
// kit bounds renewals the same way).
func renewBound(ttl time.Duration) time.Duration {
	return max(ttl/6, 250*time.Millisecond)
}

// errClosed is what a call on a closed Locker fails with, before it is
// wrapped.
var errClosed = fairlock.ErrClosed
