package disttest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/keylock"
)

// observed is one Leader of an Observe stream, as the scenario compares
// them: who, which term, and whether a gap came before it.
type observed struct {
	Value string
	Token uint64
	Gap   bool
}

// String shows a term as value#token, a vacancy as "vacant", and a gap
// before either as a leading "gap,".
func (o observed) String() string {
	s := "vacant"
	if o.Token != 0 {
		s = fmt.Sprintf("%s#%d", o.Value, o.Token)
	}
	if o.Gap {
		s = "gap," + s
	}
	return s
}

// ElectObserveEveryTerm checks that Observe over a Locker that follows a
// key (keylock.Follower) reports every term and every vacancy, in order,
// however short: an observer (an Election of its own over a Locker of
// b.New) watches 50 candidates, on five more Lockers of b.New, each lead
// and resign at once. The first 25 campaign one after another, so that a
// vacancy comes between every two terms; then one leads while the other
// 24 queue behind it (b.Calls shows them), and each resigns as soon as
// it leads, so that the terms hand over with no vacancy between them.
// The stream must be exactly: a vacancy, the 25 terms each followed by a
// vacancy, then the 25 queued terms in the order of their tokens, then a
// vacancy; each term with the value and token its candidate saw, and no
// gap. A polling Observe (every interval) sees a few of these states at
// most. The election is on the key "leader" under prefix. It fails at
// once if b.New's Locker is no keylock.Follower.
func ElectObserveEveryTerm(t *testing.T, b Backend, prefix string) {
	const lockers, terms = 5, 50
	ol := b.New(t, prefix)
	if _, ok := ol.(keylock.Follower); !ok {
		t.Fatalf("disttest: %T is no keylock.Follower", ol)
	}
	observer := elect.New(ol, "leader")
	es := make([]*elect.Election, lockers)
	for i := range es {
		es[i] = elect.New(b.New(t, prefix), "leader")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := observer.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // guards seen
	var seen []observed
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for l := range stream {
			mu.Lock()
			seen = append(seen, observed{l.Value, l.Token, l.Gap})
			mu.Unlock()
		}
	}()

	want := []observed{{}}
	value := func(i int) string { return fmt.Sprintf("c%02d", i) }
	for i := range terms / 2 {
		term, err := es[i%lockers].Campaign(ctx, value(i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, observed{Value: value(i), Token: term.Token()}, observed{})
		if err := term.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}

	first, err := es[0].Campaign(ctx, value(terms/2))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, observed{Value: value(terms / 2), Token: first.Token()})
	led := make(chan observed, terms)
	for i := terms/2 + 1; i < terms; i++ {
		go func() {
			term, err := es[i%lockers].Campaign(ctx, value(i))
			if err != nil {
				t.Error(err)
				led <- observed{}
				return
			}
			led <- observed{Value: value(i), Token: term.Token()}
			if err := term.Resign(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	b.AwaitCalls(t, prefix, "leader", terms/2, 30*time.Second)
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var queued []observed
	for range terms/2 - 1 {
		select {
		case o := <-led:
			queued = append(queued, o)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of the queued candidates led within 30 s", len(queued))
		}
	}
	slices.SortFunc(queued, func(a, b observed) int { return cmp.Compare(a.Token, b.Token) })
	want = append(append(want, queued...), observed{})

	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-collected
	if !slices.Equal(seen, want) {
		t.Fatalf("Observe reported %d states:\n%v\nthe candidates led (%d states):\n%v", len(seen), seen, len(want), want)
	}
}
