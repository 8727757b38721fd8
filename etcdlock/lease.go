package etcdlock

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/backend"
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

// leaseKeeper keeps a Locker's lease: the kit's Keeper (which grants the
// current lease, hands it to calls, replaces it when it ends and revokes
// those given up) on etcd's leases, and the renewals. newLeaseKeeper sets
// the fields; they do not change after.
type leaseKeeper struct {
	*backend.Keeper
	k      *backend.Core
	client *clientv3.Client
	ttl    time.Duration // asked of the server: the option rounded up to whole seconds
}

// newLeaseKeeper returns k's lease keeper, with no lease yet (Start, or
// grantFirst, grants the first). A replacement's first Grant is bounded
// by twice renewBound, doubling: one that went to a member that no longer
// answers is retried, on the client's next connection, soon; a slow
// quorum gets longer each time.
func newLeaseKeeper(k *backend.Core, client *clientv3.Client, ttl time.Duration) *leaseKeeper {
	lk := &leaseKeeper{k: k, client: client, ttl: ttl}
	lk.Keeper = backend.NewKeeper(k, "lease", 2*renewBound(ttl), lk.grant, lk.revoke)
	return lk
}

// leaseID returns the etcd lease of one of the kit's sessions (named with
// its id in hex).
func leaseID(s *backend.Session) clientv3.LeaseID {
	id, _ := strconv.ParseUint(s.ID(), 16, 64)
	return clientv3.LeaseID(id)
}

// grant asks the server for a new lease and starts the kit's session for
// it, with the TTL the server granted: the Keeper's open.
func (lk *leaseKeeper) grant(ctx context.Context) (*backend.Session, error) {
	sent := time.Now()
	resp, err := lk.client.Grant(ctx, int64(lk.ttl/time.Second))
	if err != nil {
		return nil, err
	}
	return lk.k.StartSession(strconv.FormatUint(uint64(resp.ID), 16), sent, time.Duration(resp.TTL)*time.Second), nil
}

// revoke revokes s's lease, which deletes every key attached to it; a
// lease already gone is not an error: the Keeper's end.
func (lk *leaseKeeper) revoke(ctx context.Context, s *backend.Session) error {
	_, err := lk.client.Revoke(ctx, leaseID(s))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
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
	go func() { granted <- lk.Start(gctx) }()
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
