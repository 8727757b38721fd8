package elect_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
)

// inProcessBackend is the in-process lock as the election scenarios of
// package disttest take a backend: every Locker it makes is a view of
// fl (whatever the prefix), and a key's calls are fl's.
func inProcessBackend(fl *fairlock.Locker[string]) disttest.Backend {
	return disttest.Backend{
		New:   func(testing.TB, string) keylock.Locker { return keylock.InProcess(fl) },
		Calls: func(_ testing.TB, _, key string) int { return len(fl.Calls(key)) },
	}
}

// TestObserveEveryTerm: over the in-process lock, which follows a key
// (keylock.Follower), Observe reports each of 50 terms that begin and
// end without a pause, and each vacancy between them, in order
// (disttest.ElectObserveEveryTerm). A polling Observe (the Locker hidden
// behind listerOnly) reports only the states its reads happen to find,
// and fails it.
func TestObserveEveryTerm(t *testing.T) {
	fl, _ := newLocker(t, "every-term")
	disttest.ElectObserveEveryTerm(t, inProcessBackend(fl), "")
}

// listerOnly hides every method of a Locker but keylock.Locker's and
// Calls: a Locker that can list a key's calls but not follow them, on
// which Observe polls.
type listerOnly struct {
	keylock.Locker
	ls keylock.Lister
}

func (l listerOnly) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	return l.ls.Calls(ctx, key)
}

// TestObservePollingSaysGap: a polling Observe (a Locker that lists but
// does not follow) marks every change after the first with Gap, since a
// term between two reads could have gone unseen; a following one marks
// none.
func TestObservePollingSaysGap(t *testing.T) {
	_, l := newLocker(t, "polling-gap")
	for _, c := range []struct {
		name string
		l    keylock.Locker
		gap  bool
	}{
		{"polling", listerOnly{l, l.(keylock.Lister)}, true},
		{"following", l, false},
	} {
		e := elect.New(c.l, "leader", elect.WithInterval(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := e.Observe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := recv(t, stream, "the first state"); !got.Vacant() || got.Gap {
			t.Fatalf("%s: first: %+v, want a vacancy without a gap", c.name, got)
		}
		term, err := e.Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if got := recv(t, stream, "the term"); got.Token != term.Token() || got.Gap != c.gap {
			t.Fatalf("%s: got %+v, want token %d with Gap %v", c.name, got, term.Token(), c.gap)
		}
		term.Resign(ctx)
		if got := recv(t, stream, "the vacancy"); !got.Vacant() || got.Gap != c.gap {
			t.Fatalf("%s: after Resign: %+v, want a vacancy with Gap %v", c.name, got, c.gap)
		}
		cancel()
		for range stream {
		}
	}
}

// TestObserveFollowSince: over a Locker that follows, a term that began
// after the stream did is reported since its grant: no later than its
// Campaign saw it, and no earlier than the Campaign began.
func TestObserveFollowSince(t *testing.T) {
	_, l := newLocker(t, "follow-since")
	e := elect.New(l, "leader")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream, "the first state")
	began := time.Now()
	term, err := e.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	got := recv(t, stream, "the term")
	if got.Value != "a" || got.Token != term.Token() || got.Since.Before(began) || got.Since.After(term.Since()) {
		t.Fatalf("got %+v; want a, token %d, since between %v and %v", got, term.Token(), began, term.Since())
	}
	term.Resign(ctx)
}
