package debug_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// TestOwnerLabelShown: an owner made with owner.NewLabeledContext is shown
// with its label in the dump, in the JSON (a field of its own), in errors
// and in warnings, so that a held lock can be tied to its request.
func TestOwnerLabelShown(t *testing.T) {
	logs := newCapture()
	l := fairlock.New[string](fairlock.WithName("labels"), fairlock.WithLongHeld(time.Millisecond), fairlock.WithLogger(slog.New(logs)))
	defer l.Close(context.Background())
	holderCtx := owner.NewLabeledContext(context.Background(), "req-42")
	g, err := l.Lock(holderCtx, "user-13")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	id := owner.Of(holderCtx)

	// An error.
	_, err = l.TryLock(holderCtx, "user-13")
	if !errors.Is(err, fairlock.ErrReentrant) || !strings.Contains(err.Error(), `(`+id.Name()+` "req-42")`) {
		t.Fatalf("error %q does not name the owner with its label", err)
	}

	// The text dump.
	text := dumpText(t)
	if !strings.Contains(text, `holder: `+id.Name()+` "req-42" token`) {
		t.Fatalf("dump does not show the holder's label:\n%s", text)
	}

	// The JSON: the owner's name and its label, each a field.
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(debug.Snapshot()); err != nil {
		t.Fatal(err)
	}
	var states []struct {
		Name string
		Held []struct {
			Key     string
			Holders []struct{ Owner, Label string }
		}
	}
	if err := json.Unmarshal(b.Bytes(), &states); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, st := range states {
		if st.Name != "labels" {
			continue
		}
		h := st.Held[0].Holders[0]
		found = st.Held[0].Key == "user-13" && h.Owner == id.Name() && h.Label == "req-42"
	}
	if !found {
		t.Fatalf("JSON lacks key user-13 held by %s labelled req-42:\n%s", id.Name(), b.String())
	}

	// A warning: the label as an attribute of its own.
	r := logs.next(t, "fairlock: lock held too long")
	if r["key"] != "user-13" || r["holder"] != id.Name() || r["holder_label"] != "req-42" {
		t.Fatalf("warning %v does not carry key user-13, holder %s and its label", r, id.Name())
	}
}

// TestLabelOutlivesTheHoldersContext: a handler locks with a labelled
// context and then blocks without touching it. Go may collect that
// context while the lock is held, and owner.ID.Label with it; the dump,
// the JSON and the long-held warning must still show the label, which
// the call recorded: the stuck holder is the case labels are for.
func TestLabelOutlivesTheHoldersContext(t *testing.T) {
	logs := newCapture()
	l := fairlock.New[string](fairlock.WithName("dropped-ctx"), fairlock.WithLongHeld(20*time.Millisecond), fairlock.WithLogger(slog.New(logs)))
	defer l.Close(context.Background())
	// The helper keeps no reference to its ctx once it returns.
	lock := func() (fairlock.Guard[string], owner.ID) {
		ctx := owner.NewLabeledContext(context.Background(), "req-42")
		g, err := l.Lock(ctx, "user-13")
		if err != nil {
			t.Fatal(err)
		}
		return g, owner.Of(ctx)
	}
	g, id := lock()
	defer g.Unlock()
	// Collect until the flow's label is gone from the table behind
	// ID.Label: the context is unreachable though its flow holds the key.
	for i := 0; id.Label() != ""; i++ {
		if i == 1000 {
			t.Fatalf("the holder's context is still reachable after %d collections", i)
		}
		runtime.GC()
		runtime.Gosched()
	}

	if text := dumpText(t); !strings.Contains(text, `holder: `+id.Name()+` "req-42" token`) {
		t.Fatalf("dump lost the label of a holder whose context was collected:\n%s", text)
	}
	found := false
	for _, st := range debug.Snapshot() {
		if st.Name == "dropped-ctx" && len(st.Held) == 1 && len(st.Held[0].Holders) == 1 {
			h := st.Held[0].Holders[0]
			found = h.Owner == id.Name() && h.Label == "req-42"
		}
	}
	if !found {
		t.Fatalf("snapshot lost the label of %s, held while its context was collected: %+v", id.Name(), debug.Snapshot())
	}
	// A warning given from now on: drop those logged before.
	for len(logs.records) > 0 {
		<-logs.records
	}
	if r := logs.next(t, "fairlock: lock held too long"); r["holder"] != id.Name() || r["holder_label"] != "req-42" {
		t.Fatalf("warning %v does not carry holder %s and its label", r, id.Name())
	}
}

// TestHandedOffGrantShowsTheNewOwnersLabel: after Guard.HandOff the dump
// names the grant's new owner with that owner's label, not the old one's.
func TestHandedOffGrantShowsTheNewOwnersLabel(t *testing.T) {
	l := fairlock.New[string](fairlock.WithName("handed-off"), fairlock.WithDebug())
	defer l.Close(context.Background())
	g, err := l.Lock(owner.NewLabeledContext(context.Background(), "req-1"), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	wctx := owner.NewLabeledContext(context.Background(), "worker-7")
	if !g.HandOff(owner.Of(wctx)) {
		t.Fatal("HandOff of a current grant reported false")
	}
	if text := dumpText(t); !strings.Contains(text, `holder: `+owner.Of(wctx).Name()+` "worker-7" token`) || strings.Contains(text, "req-1") {
		t.Fatalf("dump does not show the grant as the worker's, with its label:\n%s", text)
	}
	runtime.KeepAlive(wctx)
}
