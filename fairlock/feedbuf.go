package fairlock

import (
	"sync"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// The buffers behind Follow (follow.go says how a key is followed): what
// the transitions of a followed key write to under the shard mutex, and
// what a Feed reads from outside it.

// feedBuffer is how many changes a Feed keeps for a reader that does not
// take them; one more drops them all and marks a gap (Feed.Next).
const feedBuffer = 4096

// keyFollows is a shard's record of one followed key: the buffers of its
// Feeds, and the tokens of its holders at the last change reported to
// them.
type keyFollows struct {
	bufs   []*feedBuf
	tokens []uint64
}

// heldCall is one holder as a change records it under the shard mutex:
// enough to make a KeyCall of it later, its label read at the change.
type heldCall struct {
	owner owner.ID
	token uint64
	units int64
	label string
	since time.Time
}

// feedChange is one change as a buffer keeps it: the holders after it,
// and when it was made.
type feedChange struct {
	holders []heldCall
	at      time.Time
}

// feedBuf is one Feed's buffer of changes.
type feedBuf struct {
	ready chan struct{} // capacity 1: a change is buffered, or the Feed stopped

	mu      sync.Mutex   // guards the fields below; taken under the shard mutex, never the reverse
	pending []feedChange // changes not yet taken, oldest first, from head
	head    int          // index of the oldest change not yet taken
	gap     bool         // the buffer overflowed: the reader must read the key afresh
	stopped bool         // the Feed was stopped
}

// newFeedBuf returns an empty buffer.
func newFeedBuf() *feedBuf { return &feedBuf{ready: make(chan struct{}, 1)} }

// push buffers c, or marks a gap once the buffer is full, and wakes the
// reader. The shard mutex is held.
func (b *feedBuf) push(c feedChange) {
	b.mu.Lock()
	switch {
	case b.stopped, b.gap:
	case len(b.pending)-b.head >= feedBuffer:
		b.gap, b.pending, b.head = true, nil, 0
	default:
		b.pending = append(b.pending, c)
	}
	b.mu.Unlock()
	b.wake()
}

// wake tells the reader that something changed, without blocking.
func (b *feedBuf) wake() {
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// sameHolders reports whether e's live holders have exactly tokens.
func sameHolders[K comparable](e *entry[K], tokens []uint64) bool {
	i := 0
	for _, h := range e.holders {
		if h.owner == 0 {
			continue
		}
		if i == len(tokens) || tokens[i] != h.token {
			return false
		}
		i++
	}
	return i == len(tokens)
}

// holderTokens appends the tokens of e's live holders to dst; e may be
// nil (a key without calls).
func holderTokens[K comparable](e *entry[K], dst []uint64) []uint64 {
	if e == nil {
		return dst
	}
	for _, h := range e.holders {
		if h.owner != 0 {
			dst = append(dst, h.token)
		}
	}
	return dst
}

// heldCalls returns e's live holders, labels read now (the label behind
// an owner may go with its flow, owner.ID.Label); nil for a nil e or
// one without holders. The shard mutex is held.
func heldCalls[K comparable](e *entry[K]) []heldCall {
	if e == nil || e.holding() == 0 {
		return nil
	}
	out := make([]heldCall, 0, e.holding())
	for _, h := range e.holders {
		if h.owner == 0 {
			continue
		}
		c := heldCall{owner: h.owner, token: h.token, units: h.units}
		if h.info != nil {
			c.label, c.since = h.info.label, h.info.since
		}
		if c.label == "" {
			c.label = h.owner.Label()
		}
		out = append(out, c)
	}
	return out
}
