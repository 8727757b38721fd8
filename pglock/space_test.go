package pglock

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNamesAreProtocol pins the names every process must derive alike
// from a prefix and a key (a change would let two versions of pglock
// lock one key under two advisory locks, or miss each other's notices),
// and checks that a channel is a valid identifier for any prefix.
func TestNamesAreProtocol(t *testing.T) {
	s := newSpace("orders")
	if s.channel != "fairlock_00125d9250be8b4c" {
		t.Errorf("channel of %q: %s", "orders", s.channel)
	}
	if got := s.keyLock("order-17"); got != -845243665 {
		t.Errorf("keyLock: %d", got)
	}
	// The prefix's length is hashed in: ("ab", "c") and ("a", "bc") differ.
	if newSpace("ab").keyLock("c") == newSpace("a").keyLock("bc") {
		t.Error(`("ab", "c") and ("a", "bc") share an advisory lock`)
	}
	long := newSpace(strings.Repeat("é", 200) + "\x00")
	if len(long.channel) > 63 {
		t.Errorf("channel %q is longer than an identifier may be", long.channel)
	}
}

// TestParseNotice checks the notice format: "session:seq" words, with a
// probe's payload and anything malformed skipped.
func TestParseNotice(t *testing.T) {
	for payload, want := range map[string][]callRef{
		"1:2":                   {{1, 2}},
		"1:2 30:40":             {{1, 2}, {30, 40}},
		"":                      {},
		probePrefix + "ab12":    nil,
		"x:1 1:y 5 2:3 ::":      {{2, 3}},
		"9223372036854775807:1": {{9223372036854775807, 1}},
	} {
		if diff := cmp.Diff(want, parseNotice(payload)); diff != "" {
			t.Errorf("parseNotice(%q) (-want +got):\n%s", payload, diff)
		}
	}
	if got := parseNotice(callRef{5, 6}.String()); len(got) != 1 || got[0] != (callRef{5, 6}) {
		t.Errorf("a callRef's String does not parse back: %v", got)
	}
}
