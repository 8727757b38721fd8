package etcdlock

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Shared reads of a key's queue, for Waits.
//
// A Wait reads the nearest waitAheadLimit keys ahead of it when it
// queues; one that finds more, none of which keeps it waiting, and no
// Wait of this Locker among them to complete its view (hub.go), must read
// its whole queue (Refresh) to know that nothing further ahead keeps it
// waiting. Waits queued together behind one holder would each read the
// keys of all those ahead of them: n Waits, n²/2 keys. Instead, the Waits
// of a Locker that read the same key's queue at the same time share one
// read: the first starts it (engine.reads holds it while it is in
// flight), the others wait for its answer, and each takes from the
// listing the keys created before its own and whether its own key is
// still there. A listing read at a revision at or after a Wait's own
// key's creation holds every key ahead of it that was still there then;
// one read before it (begun before the Wait's key was written) does not
// serve it. A Wait that the shared read does not serve (it failed, or
// came too early) reads on its own, as any other call's Refresh does.

// queueRead is one shared read of a key's range in flight. Its reader
// sorts the listing out once for all who share it: a Wait needs the
// creation revision of its own key, and, of the keys ahead of it, only
// those that are not Waits (a Wait ahead never keeps a Wait waiting:
// claim.weigh), so taking its share costs it a map lookup and a walk of
// the calls that are not Waits, not a walk of the whole queue.
type queueRead struct {
	done    chan struct{}    // closed once the fields below are set
	created map[string]int64 // every key in the range → its creation revision
	others  []readKey        // the keys that are not Waits', newest first
	rev     int64            // the revision it was read at
	err     error
}

// readKey is one key of a listing and its creation revision.
type readKey struct {
	key string
	rev int64
}

// aheadOf returns, newest first, the keys of rd that are not Waits' and
// were created before rev.
func (rd *queueRead) aheadOf(rev int64) []string {
	var ahead []string
	for _, q := range rd.others {
		if q.rev < rev {
			ahead = append(ahead, q.key)
		}
	}
	return ahead
}

// sharedRead returns a read of key's queue made at a revision at least
// min, which it joins or starts under ctx, or nil if the read it joined
// or made failed, or was made before min (the caller then reads on its
// own).
func (e *engine) sharedRead(ctx context.Context, key string, min int64) *queueRead {
	mu := e.k.Mu()
	mu.Lock()
	if e.reads == nil {
		e.reads = make(map[string]*queueRead)
	}
	rd, joined := e.reads[key], true
	if rd == nil {
		rd, joined = &queueRead{done: make(chan struct{})}, false
		e.reads[key] = rd
	}
	mu.Unlock()
	if !joined {
		err := e.attempts(ctx, func(actx context.Context) error {
			resp, err := e.client.Get(actx, rangeOf(e.root, key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
			if err == nil {
				rd.sort(resp.Kvs)
				rd.rev = resp.Header.Revision
			}
			return err
		})
		mu.Lock()
		rd.err = err
		if e.reads[key] == rd {
			delete(e.reads, key)
		}
		mu.Unlock()
		close(rd.done)
	} else {
		select {
		case <-rd.done:
		case <-ctx.Done():
			return nil
		}
	}
	if rd.err != nil || rd.rev < min {
		return nil
	}
	return rd
}

// sort fills rd's created and others from a listing, newest first.
func (rd *queueRead) sort(kvs []*mvccpb.KeyValue) {
	rd.created = make(map[string]int64, len(kvs))
	rd.others = rd.others[:0]
	for _, kv := range kvs {
		k := string(kv.Key)
		rd.created[k] = kv.CreateRevision
		if !claimOf(k).turn {
			rd.others = append(rd.others, readKey{k, kv.CreateRevision})
		}
	}
}
