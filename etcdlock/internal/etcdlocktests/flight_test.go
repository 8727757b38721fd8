package etcdlock_test

import (
	"context"
	"encoding/json"
	"time"

	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Package flight on etcd: the Locker is etcdlock's, the Store etcd
// itself (etcdStore, below), and the processes are worker processes (the
// test binary re-executed, process_test.go) of 250 concurrent requests
// each, in package disttest's checks.

// etcdStore is a flight.Store on etcd: each entry is a JSON value under
// /cache/KEY, written in a transaction guarded by the grant's IsOwner,
// so that a grant that has ended (its lease expired, its key deleted)
// writes nothing. It keeps no expiry of its own (that would take a lease
// per entry): flight serves an entry only until its Expires.
type etcdStore[V any] struct{ c *clientv3.Client }

func (s etcdStore[V]) Get(ctx context.Context, key string) (e flight.Entry[V], ok bool, err error) {
	resp, err := s.c.Get(ctx, "/cache/"+key)
	if err != nil || len(resp.Kvs) == 0 {
		return e, false, err
	}
	err = json.Unmarshal(resp.Kvs[0].Value, &e)
	return e, err == nil, err
}

func (s etcdStore[V]) Set(ctx context.Context, key string, e flight.Entry[V], _ time.Duration, l keylock.Lease) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tr, err := s.c.Txn(ctx).If(isOwner(l)).Then(clientv3.OpPut("/cache/"+key, string(b))).Commit()
	if err == nil && !tr.Succeeded {
		err = flight.ErrFenced
	}
	return err
}
