package etcdlock

import (
	"strconv"
	"strings"

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
// creation-revision order. The value is "host:pid owner", for people
// looking at the prefix with etcdctl; the Locker never reads it.

// escapeKey returns k with '%' and '/' percent-encoded.
func escapeKey(k string) string {
	if !strings.ContainsAny(k, "%/") {
		return k
	}
	var b strings.Builder
	b.Grow(len(k) + 8)
	for i := 0; i < len(k); i++ {
		switch c := k[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

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
	if !strings.Contains(esc, "%") {
		return esc, true
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		if esc[i] != '%' {
			b.WriteByte(esc[i])
			continue
		}
		if i+2 >= len(esc) {
			return "", false
		}
		switch esc[i+1 : i+3] {
		case "25":
			b.WriteByte('%')
		case "2F":
			b.WriteByte('/')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}

// rootOf returns the etcd key prefix of a Locker made with prefix: prefix
// with exactly one trailing '/'.
func rootOf(prefix string) string { return strings.TrimRight(prefix, "/") + "/" }

// rangeOf returns the etcd key prefix under which key's calls queue.
func (l *Locker) rangeOf(key string) string { return l.root + escapeKey(key) + "/" }

// newName returns a fresh etcd key for a call on key under lease id.
func (l *Locker) newName(key string, id clientv3.LeaseID) string {
	var b strings.Builder
	r := l.rangeOf(key)
	b.Grow(len(r) + 34)
	b.WriteString(r)
	b.WriteString(strconv.FormatUint(uint64(id), 16))
	b.WriteByte('-')
	b.WriteString(strconv.FormatUint(l.seq.Add(1), 16))
	return b.String()
}
