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
//
// # Labels
//
// A flow made with [NewLabeledContext] carries a short label chosen by
// the caller, a request ID for instance, that [ID.String] shows beside the
// token: flow#3 "req-42". Every error, debug dump and warning of fairlock
// names owners that way, so a held lock can be tied to its request. The
// label is kept in a table beside the token, not in the ID (an ID stays a
// number, as cheap to compare and store as before), and it is dropped
// once no context carrying the flow is reachable any more: a label costs
// memory only while its flow can still make calls. Flows made with
// [NewContext] and goroutines have no label and cost nothing more.
//
// Reachable means reachable to the garbage collector, and Go may collect
// a context as soon as no code will use it again, even while the function
// that made it still runs (a handler blocked after its last use of ctx).
// [ID.Label] is then empty though the flow is alive. A holder of a label
// that must outlive that reads it with [LabelOf] while it has the context
// and keeps the string: fairlock does so for every call of a Locker with
// debug on, so that a dump and a long-held warning show the label of a
// flow that holds a lock and no longer touches its context.
package owner

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

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

// NewLabeledContext is [NewContext] with a label: it returns a child of
// parent that carries a new flow token, and the token's String, and so
// every fairlock error, debug dump and warning naming the flow, shows
// label beside it, quoted as keys are: flow#3 "req-42". label should be
// short, a request or job ID; it is cut to its first [MaxLabel] bytes (on
// a rune boundary). An empty label makes a flow without one, as
// NewContext does.
//
// It allocates two child contexts, the token they carry, a copy of the
// label (strings.Clone, so that a label cut from a large string does not
// keep it reachable) and the label's entry in a process-wide table. The
// entry, and so [ID.Label], is kept while a context carrying the token is
// reachable to the garbage collector, and deleted after
// (runtime.AddCleanup), so labels do not outlive their flows. What keeps
// a label alive is the context, not the flow's calls: an error, or an ID,
// that outlives every such context shows the flow without its label, and
// so may a flow whose code still runs but no longer uses its context.
// [LabelOf] reads the label from the context itself, for code that keeps
// it (fairlock's debug records do, per call). A nil parent panics, as
// context.WithValue does.
func NewLabeledContext(parent context.Context, label string) context.Context {
	id := ID(lastFlow.Add(1)) | flowBit
	if label == "" {
		return context.WithValue(parent, ctxKey{}, id)
	}
	if len(label) > MaxLabel {
		n := MaxLabel
		for n > 0 && !utf8.RuneStart(label[n]) {
			n--
		}
		label = label[:n]
	}
	label = strings.Clone(label) // keep no larger string it was cut from
	tok := &labeledToken{id: id, label: label}
	labels.Store(id, label)
	labelCount.Add(1)
	runtime.AddCleanup(tok, dropLabel, id)
	// The token rides in a context of its own, under the flow's ID, so
	// that FromContext reads a labelled flow as any other.
	return context.WithValue(context.WithValue(parent, labelKey{}, tok), ctxKey{}, id)
}

// labelKey is the context key of a labelled flow's token.
type labelKey struct{}

// MaxLabel is the longest label, in bytes, that NewLabeledContext keeps.
const MaxLabel = 64

// labeledToken is kept in a labelled flow's context. Its reachability is
// the flow's: the label is dropped when the last context holding it, or a
// context derived from one, is collected. It holds a pointer (the label), so the runtime never batches
// it with other small objects in one tiny-allocator block, which would
// delay its cleanup (see runtime.AddCleanup).
type labeledToken struct {
	id    ID
	label string
}

// labels maps the IDs of labelled flows to their labels; labelCount
// counts its entries, so that String looks nothing up while no flow has a
// label.
var (
	labels     sync.Map // ID -> string
	labelCount atomic.Int64
)

// dropLabel deletes id's label; runtime.AddCleanup calls it once the
// flow's token is unreachable.
func dropLabel(id ID) {
	labels.Delete(id)
	labelCount.Add(-1)
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

// LabelOf returns the label of the flow that ctx carries, as given to
// [NewLabeledContext] (cut to [MaxLabel]), or "" if ctx carries no flow,
// a flow without a label, or is nil. It reads the label from ctx itself,
// not from the table behind [ID.Label], so it does not depend on when
// the garbage collector finds the flow's contexts unreachable: a caller
// that keeps the string keeps the label for as long as it needs it. A
// flow forked from a labelled one with [NewContext] has no label. It
// allocates nothing; like ctx.Value it walks ctx's chain of parents.
func LabelOf(ctx context.Context) string {
	id, ok := FromContext(ctx)
	if !ok {
		return ""
	}
	if tok, _ := ctx.Value(labelKey{}).(*labeledToken); tok != nil && tok.id == id {
		return tok.label
	}
	return ""
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

// Label returns the label of a flow made with [NewLabeledContext], while
// a context carrying it is reachable to the garbage collector (see
// Labels in the package doc, and [LabelOf]); "" for any other ID. It takes no
// lock and allocates nothing; while no flow has a label it reads one
// atomic counter.
func (id ID) Label() string {
	if !id.IsFlow() || labelCount.Load() == 0 {
		return ""
	}
	if l, ok := labels.Load(id); ok {
		return l.(string)
	}
	return ""
}

// String returns [ID.Name], followed, for a flow with a label, by a space
// and the label quoted as a Go string (control characters escaped), so
// that a label cannot forge a line of a dump or a log record:
// `flow#3 "req-42"`.
func (id ID) String() string {
	name := id.Name()
	if l := id.Label(); l != "" {
		return name + " " + strconv.Quote(l)
	}
	return name
}

// Name returns "flow#N" for a flow token, "goroutine#N" for a goroutine
// id (N is the runtime's goroutine id, as in a stack dump), and "none" for
// the zero ID: String without the label.
func (id ID) Name() string {
	switch {
	case id == 0:
		return "none"
	case id.IsFlow():
		return "flow#" + strconv.FormatUint(uint64(id&^flowBit), 10)
	default:
		return "goroutine#" + strconv.FormatUint(uint64(id), 10)
	}
}
