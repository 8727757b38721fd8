package etcdlock

import (
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The key layout. A Locker with prefix P keeps, for each call that is
// queued on or holds key k, exactly one etcd key
//
//	P/<escape(k)>/<lease>-<n>
//
// where <lease> is the Locker's lease ID in hex and <n> a per-Locker
// counter in hex, so that every call has its own key, never one per
// session (etcd-io/etcd#11360). escape percent-encodes '%' and '/' (as
// %25 and %2F) and nothing else, so escape(k) never contains '/': the
// range P/<escape(k)>/ holds k's calls and no other key's ("a" and "a/b"
// are P/a/ and P/a%2Fb/, disjoint). Within a range, the key with the
// smallest creation revision is the holder and the others wait in
// creation-revision order. The value says where the call comes from,
// when it was written, and its owner and label (list.go): what a listing
// reads (Locker.Calls), and what people looking at the prefix with
// etcdctl see; the grant never depends on it.
//
// The last segment also says what the call asks for, so that every
// process decides a grant from the names of the keys ahead alone (a
// keys-only read, and the watch's deletions, carry nothing else):
//
//	<lease>-<n>              Lock, TryLock: exclusive
//	<lease>-<n>-r            RLock, TryRLock: shared
//	<lease>-<n>-w            Wait: a turn, exclusive until it comes
//	<lease>-<n>-u<w>.<size>  Semaphore.Acquire, TryAcquire: w of size units
//
// (w and size in decimal). A call is granted when the calls ahead of it
// leave room for it (claim.weigh, waiter.ready): an exclusive call, when
// none is left but Waits; a shared one, when every call ahead is shared
// or a Wait whose turn has come (only Waits ahead of it); w units, when
// the units of every call ahead plus w fit in size. A Wait whose turn
// has come is transparent: the calls behind it are judged as if it were
// gone, before its Locker deletes its key, so one release frees every
// Wait directly behind it and the call behind them at once. A name this
// layout does not know counts as exclusive, so a process never grants
// beside a call it cannot read (an older release reads a Wait's name so).

// escapeKey returns k with '%' and '/' percent-encoded.
func escapeKey(k string) string { return backend.Escape(k, "/") }

// UnescapeKey returns the key whose calls queue under the etcd key name,
// which must be one of a Locker's keys (prefix/<escaped key>/<id>), and
// true; or "" and false if name is not under prefix in that layout. It is
// for tools and tests that read the prefix directly (etcdctl get --prefix
// shows escaped keys).
func UnescapeKey(prefix, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, rootOf(prefix))
	if !ok {
		return "", false
	}
	esc, _, ok := strings.Cut(rest, "/")
	if !ok {
		return "", false
	}
	return backend.Unescape(esc, "/")
}

// rootOf returns the etcd key prefix of a Locker made with prefix: prefix
// with exactly one trailing '/'.
func rootOf(prefix string) string { return strings.TrimRight(prefix, "/") + "/" }

// rangeOf returns the etcd key prefix under which key's calls queue, for
// a Locker whose keys start with root (rootOf).
func rangeOf(root, key string) string { return root + escapeKey(key) + "/" }

// newName returns the etcd key, under root (rootOf), of a call on key
// under lease id that asks for c; n is the call's number, unique in its
// Locker (Locker.seq), so the name is fresh.
func newName(root, key string, id clientv3.LeaseID, n uint64, c claim) string {
	var b strings.Builder
	r := rangeOf(root, key)
	b.Grow(len(r) + 34)
	b.WriteString(r)
	b.WriteString(strconv.FormatUint(uint64(id), 16))
	b.WriteByte('-')
	b.WriteString(strconv.FormatUint(n, 16))
	switch {
	case c.turn:
		b.WriteString("-w")
	case c.size > 0:
		b.WriteString("-u")
		b.WriteString(strconv.FormatInt(c.w, 10))
		b.WriteByte('.')
		b.WriteString(strconv.FormatInt(c.size, 10))
	case c.shared:
		b.WriteString("-r")
	}
	return b.String()
}

// claim is what a call asks for: the zero claim is exclusive (Lock,
// TryLock); turn is a Wait's; shared is a reader's; size > 0 is w of a
// Semaphore's size units.
type claim struct {
	shared  bool
	turn    bool
	w, size int64
}

// claimOf reads the claim from an etcd key name in the layout above; a
// name it does not know is exclusive.
func claimOf(name string) claim {
	last := name[strings.LastIndexByte(name, '/')+1:]
	_, rest, _ := strings.Cut(last, "-")  // the lease
	_, mode, ok := strings.Cut(rest, "-") // the counter
	switch {
	case !ok:
		return claim{}
	case mode == "r":
		return claim{shared: true}
	case mode == "w":
		return claim{turn: true}
	case strings.HasPrefix(mode, "u"):
		ws, ns, _ := strings.Cut(mode[1:], ".")
		w, err1 := strconv.ParseInt(ws, 10, 64)
		n, err2 := strconv.ParseInt(ns, 10, 64)
		if err1 == nil && err2 == nil && w >= 1 && w <= n {
			return claim{w: w, size: n}
		}
	}
	return claim{}
}

// onlyWaits reports whether every key of kvs is a Wait's (true for none).
// Keys of Waits at the head of a queue hold nothing: their turn has come.
func onlyWaits(kvs []*mvccpb.KeyValue) bool {
	for _, kv := range kvs {
		if !claimOf(string(kv.Key)).turn {
			return false
		}
	}
	return true
}

// room is how much weight of the calls ahead c can be granted beside
// (see weigh): none for an exclusive or shared call, size-w for units.
func (c claim) room() int64 {
	if c.size > 0 {
		return c.size - c.w
	}
	return 0
}

// weigh returns how much the call ahead named ahead keeps c waiting: c is
// granted once the weights of the calls ahead add up to at most c.room()
// (and, for a shared call, the Waits ahead are in order: waiter.ready).
// An exclusive call or a Wait is kept waiting by every call ahead but a
// Wait (weight 1; a Wait ahead has had its turn once everything else
// ahead is gone); a shared one by every call that is neither shared nor a
// Wait (a reader ahead weighs 0); w units by the units of each call of
// the same size ahead, and by the whole size for any other call, a
// Semaphore call of another size included: units of two sizes are never
// counted together.
func (c claim) weigh(ahead string) int64 {
	a := claimOf(ahead)
	switch {
	case c.size > 0 && a.size == c.size:
		return a.w
	case c.size > 0:
		return c.size
	case a.turn && !c.shared:
		return 0
	case c.shared && (a.shared || a.turn):
		return 0
	}
	return 1
}

// total is a sum of weights (claim.weigh) that does not overflow: 128
// bits, high and low words. Each weight is at most a Semaphore's size,
// which may be as large as math.MaxInt64, so two units' weights ahead of
// a call can already overflow an int64, and a sum that wrapped around to
// a negative number would grant the call beyond the size.
type total struct{ hi, lo uint64 }

// add adds w ≥ 0.
func (t *total) add(w int64) {
	var carry uint64
	t.lo, carry = bits.Add64(t.lo, uint64(w), 0)
	t.hi += carry
}

// sub subtracts w ≥ 0, which was added before.
func (t *total) sub(w int64) {
	var borrow uint64
	t.lo, borrow = bits.Sub64(t.lo, uint64(w), 0)
	t.hi -= borrow
}

// atMost reports whether t ≤ n, for n ≥ 0.
func (t total) atMost(n int64) bool { return t.hi == 0 && t.lo <= uint64(n) }

// otherSize returns the size of the Semaphore that a key belongs to if it
// is not c's (0 if it is, or if c is no Semaphore call, or no Semaphore
// call is ahead): oldest is the size of the oldest Semaphore call among
// the keys ahead of c (0 if none). That call's size keeps the key: a
// call of another size behind it found it ahead, fails (Locker.run) and
// deletes its key, so it is never granted; until it has gone it weighs
// the whole size (weigh), and a call of the keeping size behind it waits
// for it rather than fail.
func (c claim) otherSize(oldest int64) int64 {
	if c.size > 0 && oldest > 0 && oldest != c.size {
		return oldest
	}
	return 0
}

// isOwner is the etcd comparison that holds while the key name exists
// with creation revision rev.
func isOwner(name string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(name), "=", rev)
}

// leaseOf returns the lease segment (hex) of one of a Locker's etcd key
// names (keys.go).
func leaseOf(name string) string {
	last := name[strings.LastIndexByte(name, '/')+1:]
	id, _, _ := strings.Cut(last, "-")
	return id
}

// The value of a call's key (list.go says what reads it).

// valuePrefix returns the start of every value a Locker named name in
// this process writes: `host:pid "name" `.
func valuePrefix(p keylock.Process) string {
	return p.Host + ":" + strconv.Itoa(p.PID) + " " + strconv.Quote(p.Locker) + " "
}

// valueOf returns the value of the key of a call of owner name own with
// label, written now by the Locker whose valuePrefix is prefix.
func valueOf(prefix, own, label string, now time.Time) string {
	b := make([]byte, 0, len(prefix)+len(own)+len(label)+24)
	b = append(b, prefix...)
	b = strconv.AppendInt(b, now.UnixMicro(), 10)
	b = append(b, ' ')
	b = append(b, own...)
	if label != "" {
		b = append(b, ' ')
		b = strconv.AppendQuote(b, label)
	}
	return string(b)
}

// parseValue reads a value that valueOf wrote: the process, the write's
// wall clock and the label. A value it cannot read whole (a release that
// wrote "host:pid owner") gives what it could read of it.
func parseValue(v string) (p keylock.Process, at time.Time, label string) {
	hp, rest, _ := strings.Cut(v, " ")
	if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		p.Host = hp[:i]
		p.PID, _ = strconv.Atoi(hp[i+1:])
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return p, at, ""
	}
	p.Locker, _ = strconv.Unquote(q)
	us, rest, _ := strings.Cut(strings.TrimPrefix(rest[len(q):], " "), " ")
	if n, err := strconv.ParseInt(us, 10, 64); err == nil {
		at = time.UnixMicro(n)
	}
	if _, l, ok := strings.Cut(rest, " "); ok { // past the owner
		label, _ = strconv.Unquote(l)
	}
	return p, at, label
}
