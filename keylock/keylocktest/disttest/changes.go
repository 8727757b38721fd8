package disttest

import (
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
)

// RecvChange returns the next Change of ch, a backend's Follow, failing
// t if none comes within 10 s or if ch closed.
func RecvChange(t testing.TB, ch <-chan keylock.Change) keylock.Change {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("the feed closed")
		}
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no change within 10 s")
	}
	return keylock.Change{}
}

// TokensOf returns the tokens of c's holders, in grant order.
func TokensOf(c keylock.Change) []uint64 {
	var got []uint64
	for _, h := range c.Holders {
		got = append(got, h.Token)
	}
	return got
}

// ExpectChange returns the next Change of ch (RecvChange), failing t
// unless its holders have exactly tokens, in order, and its Gap is gap.
func ExpectChange(t testing.TB, ch <-chan keylock.Change, gap bool, tokens ...uint64) keylock.Change {
	t.Helper()
	c := RecvChange(t, ch)
	if got := TokensOf(c); c.Gap != gap || !slices.Equal(got, tokens) {
		t.Fatalf("change: holders %v, gap %v; want %v, gap %v", got, c.Gap, tokens, gap)
	}
	return c
}
