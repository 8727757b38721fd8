package debug_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
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
