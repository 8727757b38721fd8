package fairlock

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fairlock/fairlock/owner"
)

// TestDeadlockCheckAgainstModel: on random wait-for graphs of up to 8
// owners and 8 keys, in both AND (Locker) and OR (Semaphore) mode, the
// detector refuses a new wait exactly when a plain fixed-point reduction
// over the whole graph says its key can never be granted, and every
// refusal's Cycle has the documented shape: it starts with the refused
// call, each edge's owner waits for its key, each key is held by the next
// edge's owner, and the last by the owner at the cycle's start.
func TestDeadlockCheckAgainstModel(t *testing.T) {
	const cases = 20_000
	for _, or := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(1, 2))
		refusals := 0
		for range cases {
			d, key, requester := randomGraph(rng, or)
			want := modelRefuses(d, key, requester)
			de := d.deadlock(key, requester)
			if (de != nil) != want {
				t.Fatalf("or=%v: %v asks for key %d in\n%s\ndetector refuses %v, model %v", or, requester, key, describe(d), de != nil, want)
			}
			if de == nil {
				continue
			}
			refusals++
			if bad := badCycle(d, key, requester, de); bad != "" {
				t.Fatalf("or=%v: %v asks for key %d in\n%s\nCycle %v (loop %d): %s", or, requester, key, describe(d), de.Cycle, de.loop, bad)
			}
		}
		// The generator must give both answers often, or the test proves
		// little.
		if refusals < cases/20 || refusals > cases*19/20 {
			t.Fatalf("or=%v: %d refusals in %d cases", or, refusals, cases)
		}
	}
}

// randomGraph fills a detector with holds and waits of owners 1..n on keys
// 0..m-1, and picks a key and a requester that does not hold it.
func randomGraph(rng *rand.Rand, or bool) (*detector[int], int, owner.ID) {
	d := newDetector[int](or)
	n, m := 1+rng.IntN(8), 1+rng.IntN(8)
	for o := owner.ID(1); o <= owner.ID(n); o++ {
		for k := range m {
			switch p := rng.Float64(); {
			case p < 0.3:
				if d.holders[k] == nil {
					d.holders[k] = map[owner.ID]int32{}
				}
				d.holders[k][o] = int32(1 + rng.IntN(2))
			case p < 0.45:
				if d.waits[o] == nil {
					d.waits[o] = map[int]int{}
				}
				d.waits[o][k] = 1 + rng.IntN(2)
			}
		}
	}
	requester := owner.ID(1 + rng.IntN(n))
	key := rng.IntN(m)
	delete(d.holders[key], requester) // a holder's call is reentrant, never checked
	return d, key, requester
}

// modelRefuses is Holt's reduction, run to a fixed point over every owner:
// an owner finishes once every key it waits for (the requester: and key)
// can be granted; a key with no holder can be; otherwise, AND: once all
// its holders finish, OR: once any does. It refuses if key is never
// granted.
func modelRefuses(d *detector[int], key int, requester owner.ID) bool {
	fin := map[owner.ID]bool{}
	granted := func(k int) bool {
		hs := d.holders[k]
		if len(hs) == 0 {
			return true
		}
		for h := range hs {
			if fin[h] == d.orWaits {
				return d.orWaits
			}
		}
		return !d.orWaits
	}
	owners := map[owner.ID]bool{requester: true}
	for o := range d.waits {
		owners[o] = true
	}
	for _, hs := range d.holders {
		for h := range hs {
			owners[h] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for o := range owners {
			if fin[o] {
				continue
			}
			ok := o != requester || granted(key)
			for k := range d.waits[o] {
				ok = ok && granted(k)
			}
			if ok {
				fin[o], changed = true, true
			}
		}
	}
	return !granted(key)
}

// badCycle says what is wrong with a refusal's Cycle, or "".
func badCycle(d *detector[int], key int, requester owner.ID, de *DeadlockError) string {
	c := de.Cycle
	if len(c) == 0 || c[0] != (WaitEdge{Owner: requester, Key: key}) {
		return "it does not start with the refused call"
	}
	if de.loop < 0 || de.loop >= len(c) || de.loop > 0 && c[de.loop].Owner == requester {
		return "the cycle's start is out of place"
	}
	seen := map[owner.ID]bool{}
	for i, e := range c {
		if seen[e.Owner] {
			return fmt.Sprintf("edge %d: %v appears twice", i, e.Owner)
		}
		seen[e.Owner] = true
		k := e.Key.(int)
		if i > 0 && d.waits[e.Owner][k] == 0 {
			return fmt.Sprintf("edge %d: %v does not wait for %d", i, e.Owner, k)
		}
		next := i + 1
		if next == len(c) {
			next = de.loop
		}
		if d.holders[k][c[next].Owner] == 0 {
			return fmt.Sprintf("edge %d: %d is not held by %v", i, k, c[next].Owner)
		}
	}
	return ""
}

// describe lists a detector's graph, one owner per line.
func describe(d *detector[int]) string {
	s := ""
	for o := owner.ID(1); o <= 8; o++ {
		var holds []int
		for k := range 8 {
			if d.holders[k][o] > 0 {
				holds = append(holds, k)
			}
		}
		var waits []int
		for k := range 8 {
			if d.waits[o][k] > 0 {
				waits = append(waits, k)
			}
		}
		if holds != nil || waits != nil {
			s += fmt.Sprintf("  %v holds %v, waits for %v\n", o, holds, waits)
		}
	}
	return s
}
