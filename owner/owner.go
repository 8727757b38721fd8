// Package owner names the owner of a fairlock lock: the logical flow that
// holds it or waits for it.
//
// A flow is identified by a token carried in a context.Context
// ([NewContext]); every goroutine that carries the same context, or one
// derived from it, belongs to that flow. Work forked to run concurrently
// should take its own token with [NewContext], or the forked goroutines are
// one owner and a lock held by one of them is reentrant for the others.
//
// A context without a token falls back to the calling goroutine's id, read
// with github.com/petermattis/goid. That is the identity sync.Mutex-style
// code expects, and it is why a guard locked under the fallback is owned by
// the goroutine that locked it, not by whoever unlocks it.
//
// # ID spaces
//
// Token IDs and goroutine IDs never collide: tokens have the top bit of the
// 64-bit ID set ([ID] values from 1<<63 upward), goroutine IDs never do.
// The runtime numbers goroutines from 1 with a 64-bit counter, so a
// goroutine id reaching 1<<63 would take centuries of goroutine creation;
// [Of] masks the bit off all the same, so the spaces stay disjoint even
// then.
package owner

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/petermattis/goid"
)

// ID identifies an owner: a flow token or a goroutine. The zero ID means
// "no owner". IDs are comparable and stable for the life of the flow or
// goroutine; a goroutine's ID may be reused by the runtime only in theory
// (the counter is 64-bit and never wraps in practice).
type ID uint64

// flowBit marks an ID as a flow token rather than a goroutine id.
const flowBit ID = 1 << 63

// lastFlow is the counter behind flow tokens; the first token is 1|flowBit.
var lastFlow atomic.Uint64

// ctxKey is the context key for flow tokens; an unexported type so no other
// package can collide with it.
type ctxKey struct{}

// NewContext returns a child of parent that carries a new flow token, so
// that every call made with it, from any goroutine, belongs to one new
// owner. It allocates the child context (one context.WithValue). A token
// already present in parent is shadowed, not reused: forked work gets an
// owner of its own. A nil parent panics, as context.WithValue does.
func NewContext(parent context.Context) context.Context {
	id := ID(lastFlow.Add(1)) | flowBit
	return context.WithValue(parent, ctxKey{}, id)
}

// FromContext returns the flow token carried by ctx and true, or 0 and
// false if ctx carries none (a nil ctx carries none).
func FromContext(ctx context.Context) (ID, bool) {
	if ctx == nil {
		return 0, false
	}
	id, ok := ctx.Value(ctxKey{}).(ID)
	return id, ok
}

// Of returns the owner of a call made with ctx: its flow token if it carries
// one, otherwise the calling goroutine's id. It never returns 0 and does
// not allocate.
func Of(ctx context.Context) ID {
	if id, ok := FromContext(ctx); ok {
		return id
	}
	return Goroutine()
}

// Goroutine returns the calling goroutine's owner ID, ignoring any flow
// token. It does not allocate.
func Goroutine() ID {
	return ID(goid.Get()) &^ flowBit
}

// IsFlow reports whether id is a flow token (from [NewContext]) rather
// than a goroutine id.
func (id ID) IsFlow() bool { return id&flowBit != 0 }

// String returns "flow#N" for a flow token, "goroutine#N" for a goroutine
// id (N is the runtime's goroutine id, as in a stack dump), and "none" for
// the zero ID.
func (id ID) String() string {
	switch {
	case id == 0:
		return "none"
	case id.IsFlow():
		return "flow#" + strconv.FormatUint(uint64(id&^flowBit), 10)
	default:
		return "goroutine#" + strconv.FormatUint(uint64(id), 10)
	}
}
