package etcdlock

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
// read: the first starts it (waitReads holds it while it is in
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

// waitReads are the shared reads in flight, by key: the first Wait to
// read a key's queue starts one, and the Waits that come while it is in
// flight join it. It is guarded by the Core's mutex.
type waitReads map[string]*queueRead

// join returns a read of key's queue made at a revision at least min,
// which it joins or starts with read under ctx, or nil if the read it
// joined or made failed, or was made before min (the caller then reads
// on its own). read returns the queue's keys, newest first, and the
// revision they were read at. mu is the Core's mutex, which guards rs.
func (rs *waitReads) join(ctx context.Context, mu *sync.Mutex, key string, min int64, read func(context.Context) ([]*mvccpb.KeyValue, int64, error)) *queueRead {
	mu.Lock()
	if *rs == nil {
		*rs = make(waitReads)
	}
	rd, joined := (*rs)[key], true
	if rd == nil {
		rd, joined = &queueRead{done: make(chan struct{})}, false
		(*rs)[key] = rd
	}
	mu.Unlock()
	if !joined {
		kvs, rev, err := read(ctx)
		if err == nil {
			rd.sort(kvs)
			rd.rev = rev
		}
		mu.Lock()
		rd.err = err
		if (*rs)[key] == rd {
			delete(*rs, key)
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
