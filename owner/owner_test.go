package owner_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/fairlock/fairlock/owner"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewContextGivesDistinctFlowTokens(t *testing.T) {
	ctx := context.Background()
	a, b := owner.NewContext(ctx), owner.NewContext(ctx)
	ida, ok := owner.FromContext(a)
	if !ok || ida == 0 || !ida.IsFlow() {
		t.Fatalf("FromContext(NewContext) = %v, %v; want a flow token", ida, ok)
	}
	idb, _ := owner.FromContext(b)
	if ida == idb {
		t.Fatalf("two NewContext calls share token %v", ida)
	}
	// A child context keeps its parent's flow.
	child, cancel := context.WithCancel(a)
	defer cancel()
	if got := owner.Of(child); got != ida {
		t.Fatalf("Of(child of flow %v) = %v", ida, got)
	}
	// Forking shadows the parent's token.
	if got := owner.Of(owner.NewContext(a)); got == ida {
		t.Fatalf("NewContext(a) reused a's token %v", ida)
	}
}

func TestOfWithoutTokenIsTheGoroutine(t *testing.T) {
	if _, ok := owner.FromContext(context.Background()); ok {
		t.Fatal("Background carries a token")
	}
	//lint:ignore SA1012 a nil ctx carries no token: part of the contract
	if _, ok := owner.FromContext(nil); ok {
		t.Fatal("nil ctx carries a token")
	}
	id := owner.Of(context.Background())
	if id == 0 || id.IsFlow() {
		t.Fatalf("Of(Background) = %v; want a goroutine id", id)
	}
	if id != owner.Goroutine() {
		t.Fatalf("Of(Background) = %v, Goroutine() = %v", id, owner.Goroutine())
	}
	// The id matches the runtime's own goroutine number, as in a stack dump.
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	field := strings.Fields(string(buf))[1] // "goroutine 18 [running]:"
	want, err := strconv.ParseUint(field, 10, 64)
	if err != nil {
		t.Fatalf("parse %q: %v", buf, err)
	}
	if uint64(id) != want {
		t.Fatalf("Of = %v, runtime says goroutine %d", id, want)
	}
}

// TestGoroutineIDsDistinct guards against goroutine-id extraction breaking on
// a new Go release (go-deadlock issues #35 and #45: every goroutine read the
// same id). Live goroutines must all have different ids, and every id must
// agree with the runtime's stack header.
func TestGoroutineIDsDistinct(t *testing.T) {
	const n = 200
	ids := make([]owner.ID, n)
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			ids[i] = owner.Of(context.Background())
			ready.Done()
			release.Wait() // keep every goroutine alive until all ids are read
		}()
	}
	ready.Wait()
	release.Done()
	done.Wait()
	seen := make(map[owner.ID]int, n)
	for i, id := range ids {
		if id == 0 || id.IsFlow() {
			t.Fatalf("goroutine %d got id %v", i, id)
		}
		if j, dup := seen[id]; dup {
			t.Fatalf("goroutines %d and %d share id %v", i, j, id)
		}
		seen[id] = i
	}
}

func TestTokensAndGoroutinesNeverCollide(t *testing.T) {
	g := owner.Goroutine()
	for range 1000 {
		f, _ := owner.FromContext(owner.NewContext(context.Background()))
		if f == g || !f.IsFlow() {
			t.Fatalf("flow token %v collides with goroutine id space", f)
		}
	}
}

func TestString(t *testing.T) {
	ctx := owner.NewContext(context.Background())
	f, _ := owner.FromContext(ctx)
	if s := f.String(); !strings.HasPrefix(s, "flow#") || strings.Contains(s, "9223372036854775") {
		t.Fatalf("flow String = %q; want flow#N with the marker bit removed", s)
	}
	g := owner.Goroutine()
	if s, want := g.String(), "goroutine#"+strconv.FormatUint(uint64(g), 10); s != want {
		t.Fatalf("goroutine String = %q, want %q", s, want)
	}
	if s := owner.ID(0).String(); s != "none" {
		t.Fatalf("ID(0).String() = %q", s)
	}
}

func TestLabeledContextShowsItsLabel(t *testing.T) {
	ctx := owner.NewLabeledContext(context.Background(), "req-42")
	id := owner.Of(ctx)
	if !id.IsFlow() {
		t.Fatalf("Of(NewLabeledContext) = %v; want a flow token", id)
	}
	want := id.Name() + ` "req-42"`
	if got := id.String(); got != want || id.Label() != "req-42" {
		t.Fatalf("String, Label = %q, %q; want %q, %q", got, id.Label(), want, "req-42")
	}
	// Children carry the same labelled flow; a fork takes a new, unlabelled one.
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	if owner.Of(child) != id {
		t.Fatalf("Of(child) = %v; want %v", owner.Of(child), id)
	}
	if fork := owner.Of(owner.NewContext(ctx)); fork == id || fork.Label() != "" {
		t.Fatalf("NewContext(labelled ctx) = %v; want a new flow without a label", fork)
	}
	// A label is escaped as a key is: it cannot forge a line.
	forged := owner.Of(owner.NewLabeledContext(context.Background(), "a\nlevel=ERROR"))
	if s := forged.String(); strings.Contains(s, "\n") || !strings.HasSuffix(s, `"a\nlevel=ERROR"`) {
		t.Fatalf("String of a label with a newline = %q", s)
	}
	// Unlabelled flows and goroutines have none.
	if l := owner.Of(owner.NewContext(context.Background())).Label(); l != "" {
		t.Fatalf("Label of a NewContext flow = %q", l)
	}
	if l := owner.Goroutine().Label(); l != "" {
		t.Fatalf("Label of a goroutine = %q", l)
	}
	runtime.KeepAlive(ctx)
}

func TestLabelIsCutToMaxLabel(t *testing.T) {
	long := strings.Repeat("é", owner.MaxLabel) // 2 bytes a rune
	ctx := owner.NewLabeledContext(context.Background(), long)
	l := owner.Of(ctx).Label()
	if len(l) > owner.MaxLabel || len(l) < owner.MaxLabel-1 || !strings.HasPrefix(long, l) {
		t.Fatalf("label of %d bytes kept as %d bytes %q", len(long), len(l), l)
	}
	if l := owner.Of(owner.NewLabeledContext(context.Background(), "")).Label(); l != "" {
		t.Fatalf("empty label kept as %q", l)
	}
	runtime.KeepAlive(ctx)
}

// The label goes with the last context that carries the flow: labels do
// not accumulate in a long-running process.
func TestLabelIsDroppedWithItsFlow(t *testing.T) {
	id := func() owner.ID {
		ctx := owner.NewLabeledContext(context.Background(), "gone-soon")
		id := owner.Of(ctx)
		if id.Label() != "gone-soon" {
			t.Fatalf("Label = %q while ctx is live", id.Label())
		}
		return id
	}()
	for i := 0; id.Label() != ""; i++ {
		if i == 1000 {
			t.Fatalf("label of %v still kept after %d collections", id, i)
		}
		runtime.GC() // the cleanup runs on its own goroutine after a cycle
		runtime.Gosched()
	}
	if got := id.String(); got != id.Name() {
		t.Fatalf("String after the flow is gone = %q; want %q", got, id.Name())
	}
}

// TestLabelOf: LabelOf reads a flow's label from its context, so code that
// keeps the string keeps the label however long the flow's contexts stay
// reachable; a fork, a plain flow, no flow and a nil ctx have none.
func TestLabelOf(t *testing.T) {
	ctx := owner.NewLabeledContext(context.Background(), "req-42")
	if l := owner.LabelOf(ctx); l != "req-42" {
		t.Fatalf("LabelOf(labelled ctx) = %q; want %q", l, "req-42")
	}
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	if l := owner.LabelOf(child); l != "req-42" {
		t.Fatalf("LabelOf(child of labelled ctx) = %q; want %q", l, "req-42")
	}
	if l := owner.LabelOf(owner.NewContext(ctx)); l != "" {
		t.Fatalf("LabelOf(fork of labelled ctx) = %q; want none", l)
	}
	if l := owner.LabelOf(owner.NewContext(context.Background())); l != "" {
		t.Fatalf("LabelOf(unlabelled flow) = %q; want none", l)
	}
	if l := owner.LabelOf(context.Background()); l != "" {
		t.Fatalf("LabelOf(Background) = %q; want none", l)
	}
	//lint:ignore SA1012 a nil ctx carries no flow: part of the contract
	if l := owner.LabelOf(nil); l != "" {
		t.Fatalf("LabelOf(nil) = %q; want none", l)
	}
	if n := testing.AllocsPerRun(100, func() { _ = owner.LabelOf(child) }); n != 0 {
		t.Fatalf("LabelOf allocates %v times a call", n)
	}
}

// TestLabelIsACopy: a label cut from a large string is a copy of its
// bytes, so the label table does not keep the large string reachable.
func TestLabelIsACopy(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	ctx := owner.NewLabeledContext(context.Background(), big)
	l := owner.LabelOf(ctx)
	if len(l) != owner.MaxLabel {
		t.Fatalf("label of %d bytes kept as %d bytes", len(big), len(l))
	}
	if unsafe.StringData(l) == unsafe.StringData(big) {
		t.Fatal("the label shares the bytes of the string it was cut from")
	}
}
