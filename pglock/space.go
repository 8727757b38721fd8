package pglock

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/fairlock/fairlock/keylock"
)

// The names of things: a prefix's notice channel, a key's advisory lock,
// a call's identity and mode.

// space is a prefix and the names derived from it. Lockers and
// Semaphores with the same prefix share queues; a Locker and a Semaphore
// must not share one.
type space struct {
	prefix  []byte // the fairlock_*.prefix column
	channel string // NOTIFY channel of the prefix's grants
}

// newSpace returns the space of prefix. Its channel is "fairlock_"
// followed by the 64-bit FNV-1a hash of the prefix in hex: a channel
// name is an identifier of at most 63 bytes, and a prefix may be longer
// or hold any byte. Two prefixes that share a channel only see each
// other's notices, which name calls of sessions they do not have and so
// are ignored.
func newSpace(prefix string) space {
	h := fnv.New64a()
	h.Write([]byte(prefix))
	return space{prefix: []byte(prefix), channel: fmt.Sprintf("fairlock_%016x", h.Sum64())}
}

// keyLock returns the second half of the advisory lock of key's queue in
// s (the first is lockClass): the 32-bit FNV-1a hash of the prefix's
// length, the prefix and the key, so that no two (prefix, key) pairs are
// one string. Every process must compute it alike, so it is part of the
// protocol. Two keys that share a hash only serialise their enqueues and
// releases; each still has its own queue.
func (s space) keyLock(key string) int32 {
	h := fnv.New32a()
	h.Write([]byte(strconv.Itoa(len(s.prefix))))
	h.Write([]byte{':'})
	h.Write(s.prefix)
	h.Write([]byte(key))
	return int32(h.Sum32())
}

// callRef names a call: the session that made it and the session's
// number for it. A Locker chooses seq before it sends the enqueue, so it
// knows a call's name before the database does (a notice can arrive
// before the enqueue's reply), and it can remove a call whose enqueue's
// outcome it never learned.
type callRef struct {
	Session int64
	Seq     int64
}

// String returns "session:seq", the form notices carry.
func (c callRef) String() string {
	return strconv.FormatInt(c.Session, 10) + ":" + strconv.FormatInt(c.Seq, 10)
}

// mode is a call's mode, as fairlock_calls.mode stores it.
type mode string

const (
	modeExclusive mode = "x" // Lock, TryLock
	modeShared    mode = "r" // RLock, TryRLock
	modeUnits     mode = "u" // Acquire, TryAcquire: weight units of size
	modeWait      mode = "w" // Wait: an exclusive turn that holds nothing
)

// text returns s as PostgreSQL text can hold it: valid UTF-8 without NUL
// bytes (for labels and names, which only describe a call).
func text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// listed is m as keylock.CallInfo names modes.
func (m mode) listed() string {
	switch m {
	case modeShared:
		return keylock.ModeShared
	case modeUnits:
		return keylock.ModeUnits
	case modeWait:
		return keylock.ModeWait
	}
	return keylock.ModeExclusive
}
