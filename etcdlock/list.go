package etcdlock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Who holds a key, from any process. Each call's etcd key (keys.go)
// carries, as its value, where the call comes from, when it was written
// and who made it:
//
//	<host>:<pid> <locker name, quoted> <unix µs> <owner>[ <label, quoted>]
//
// for instance `web-2:4242 "etcdlock-1" 1718000000123456 flow#3 "req-42"`:
// the Locker's host and process id, its name, the wall clock of the
// writing process in microseconds since 1970, the owner's name in that
// process, and its label (owner.NewLabeledContext) if it has one, quoted
// as Go quotes strings, so that no name or label can forge a field. It
// is written with the key, in the enqueueing transaction, and goes with
// it; it costs the few bytes it holds. A listing (List) reads the range
// of a key's calls, values included, in one linearizable read, and
// judges which calls hold the key by the rule of keys.go. etcd keeps no
// time of its own for a key, so a call's age is the reader's wall clock
// against the writer's: off by the skew between the two hosts' clocks.

// List reads key's range, values included, oldest first (one
// linearizable read), and lists its calls: which hold the key follows
// from their names by the grant rule (keys.go, and see holds).
func (e *engine) List(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	resp, err := e.client.Get(ctx, rangeOf(e.root, key), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	now := time.Now()
	claims := make([]claim, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		claims[i] = claimOf(string(kv.Key))
	}
	held := holds(claims)
	out := make([]keylock.CallInfo, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		c := claims[i]
		p, at, label := parseValue(string(kv.Value))
		info := keylock.CallInfo{Label: label, Process: p, Mode: c.mode(), Held: held[i]}
		if c.size > 0 {
			info.Units = c.w
		}
		if held[i] {
			info.Token = uint64(kv.CreateRevision)
		}
		if !at.IsZero() {
			info.Age = max(now.Sub(at), 0)
		}
		out[i] = info
	}
	return out, nil
}

// mode names what c asks for as keylock.CallInfo does.
func (c claim) mode() string {
	switch {
	case c.turn:
		return keylock.ModeWait
	case c.size > 0:
		return keylock.ModeUnits
	case c.shared:
		return keylock.ModeShared
	}
	return keylock.ModeExclusive
}

// holds returns which of a key's calls, oldest first, hold it: a prefix
// of the queue, head-of-line. A Wait holds (its turn has come) when no
// other call is held ahead of it, and is transparent: the calls behind it
// are judged as if it were gone. Another call holds when it is first
// among the held, or every held one is shared and so is it, or every
// held one is units of its size and its units fit beside theirs: the
// rule by which each waiter judges the keys ahead of it (claim.weigh),
// applied to the whole range at once.
func holds(claims []claim) []bool {
	held := make([]bool, len(claims))
	cnt := 0                    // held calls ahead, Waits not counted
	shared, units := true, true // every one of them is shared; units
	var size, sum int64         // their size and units
	for i, c := range claims {
		switch {
		case c.turn && cnt == 0:
		case c.turn:
			return held
		case cnt == 0:
			size, sum = c.size, c.w
		case c.shared && shared:
		case c.size > 0 && units && c.size == size && c.w <= size-sum:
			sum += c.w
		default:
			return held
		}
		held[i] = true
		if !c.turn {
			cnt++
			shared = shared && c.shared
			units = units && c.size > 0
		}
	}
	return held
}

var _ backend.Lister = (*engine)(nil)
