package keylock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// Every change of who holds a key: a Follower streams, for one key, each
// change of the set of calls that hold it, in the order the backend made
// them, so that a reader sees a grant that began and ended between two
// listings (Lister), which a reader that polls does not. Where the
// backend's history of a key is gone (etcd compacted the revisions the
// stream had not read yet; Redis's change log of the key lost entries
// not yet read; the in-process buffer of a reader that stopped reading
// overflowed), the stream says so with a Change whose Gap is set,
// carrying the key's holders read afresh, rather than go on as if nothing
// had been missed. The model is etcd's watch (every revision in order,
// ErrCompacted when the history is gone), as etcd's
// concurrency.Election.Observe uses it; client-go's leaderelection
// instead re-reads its lease record every retry period, and a term
// shorter than that goes unseen there.

// Change is one change of a key's holders, as a Follower delivers it.
type Change struct {
	// Holders are the calls that hold the key right after the change,
	// in grant order, each as a Lister lists a held call: its label,
	// process, mode or units, token and age. A Wait is never among them
	// (it holds nothing, even once its turn has come), and its turn is
	// not a change. Empty: nobody holds the key (a vacancy).
	Holders []CallInfo
	// At is when the change was made, as well as this process can tell:
	// in process, the instant of the grant or release; on a distributed
	// backend, when this process received it (later than the engine's
	// commit by one delivery).
	At time.Time
	// Gap says that changes between the previous Change and this one
	// may be missing: the backend's history of them was gone, and
	// Holders are the key's holders as read afresh. A reader that
	// counts every change resynchronises here.
	Gap bool
}

// Follower is implemented by the Lockers and Semaphores that can stream
// the changes of a key's holders: the in-process views (InProcess,
// InProcessSemaphore), etcdlock's and redislock's. A caller asserts it on its Locker,
// as it does Lister, and falls back to listing (Lister) where it fails:
//
//	if f, ok := l.(keylock.Follower); ok { changes, err := f.Follow(ctx, key) }
//
// How each delivers:
//
//   - In process: from the grant and release themselves, under the
//     key's shard mutex (fairlock.Locker.Follow); a reader more than 4096
//     changes behind loses them and gets a Gap. While a key is followed
//     its shard takes the mutex for every grant; a key nobody follows
//     pays nothing.
//   - etcd: a watch on the key's queue from the revision of a
//     linearizable read, replayed in this process by the rule the
//     Lockers grant by, one Change per revision that changes the
//     holders. A watch that breaks resumes from the last revision read,
//     losing nothing; a Gap only where etcd compacted the revisions not
//     yet read.
//   - Redis: a change log of the key (a stream) that every script which
//     changes the key's holders appends them to, in the same script,
//     while a follower keeps the log alive; the follower reads it with
//     XREAD BLOCK. Each entry names the one before it, so a Gap is
//     reported wherever entries not yet read were lost (trimmed behind a
//     reader about a thousand changes late, deleted, lost with a restart
//     or a failover). A key nobody follows has no log, and its scripts
//     pay one EXISTS for it.
//
// PostgreSQL does not implement it yet; package elect polls a listing
// there.
type Follower interface {
	// Follow returns a channel of key's changes: first the key's
	// holders when Follow was called (one read of the backend, made
	// before Follow returns, so that every change after its return is
	// delivered), then one Change per change of its holders, in order.
	// The channel is closed when ctx ends, or once the Locker is closed
	// (a distributed backend); a reader must keep receiving until then,
	// or cancel ctx. Follow fails with an error wrapping the context's
	// if ctx ends first, fairlock.ErrClosed once the Locker is closed (a
	// distributed backend), or the backend's error (the first read
	// failed). It starts one goroutine, which ends with the channel, and
	// allocates each Change.
	Follow(ctx context.Context, key string) (<-chan Change, error)
}

var (
	_ Follower = inProcess{}
	_ Follower = inProcessSemaphore{}
)

// Follow streams key's changes through fairlock's Locker.Follow (see
// Follower); it fails only if ctx is done.
func (v inProcess) Follow(ctx context.Context, key string) (<-chan Change, error) {
	return followFeed(ctx, key, v.l.Name(), v.l.Follow)
}

// Follow streams key's changes through fairlock's Semaphore.Follow, as
// the Locker's view does.
func (v inProcessSemaphore) Follow(ctx context.Context, key string) (<-chan Change, error) {
	return followFeed(ctx, key, v.s.Name(), v.s.Follow)
}

// followFeed opens follow's Feed of key, of a Locker named name, and
// starts the goroutine that turns its changes into Changes on the
// returned channel until ctx ends.
func followFeed(ctx context.Context, key, name string, follow func(string) (*fairlock.Feed[string], error)) (<-chan Change, error) {
	if ctx == nil {
		panic("fairlock: Follow with a nil context")
	}
	if err := ctx.Err(); err != nil {
		return nil, &fairlock.LockError{Op: "Follow", Key: key, Owner: owner.Of(ctx), Err: ctxerr.Of(ctx)}
	}
	f, err := follow(key)
	if err != nil {
		return nil, err
	}
	ch := make(chan Change)
	go func() {
		defer close(ch)
		defer f.Stop()
		for {
			kc, err := f.Next(ctx)
			if err != nil {
				return
			}
			c := Change{Holders: callInfosAt(kc.Holders, name, kc.At), At: kc.At, Gap: kc.Gap}
			select {
			case ch <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// callInfosAt is callInfos with ages counted up to at rather than now:
// the instant of the change the calls are the holders after.
func callInfosAt(kcs []fairlock.KeyCall, name string, at time.Time) []CallInfo {
	out := callInfos(kcs, name)
	for i, kc := range kcs {
		if !kc.Since.IsZero() {
			out[i].Age = max(at.Sub(kc.Since), 0)
		}
	}
	return out
}
