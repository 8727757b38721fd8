package main

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBothModesConserveMoney(t *testing.T) {
	for _, mode := range []string{"lockmany", "ordered"} {
		var out strings.Builder
		if err := run(config{mode: mode, accounts: 3, tellers: 6, transfers: 200}, &out); err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, out.String())
		}
		if !strings.Contains(out.String(), "1200 transfers") || !strings.Contains(out.String(), "conserved") {
			t.Fatalf("%s: report:\n%s", mode, out.String())
		}
		if mode == "lockmany" && !strings.Contains(out.String(), "deadlocks refused (ErrDeadlock): 0,") {
			t.Fatalf("LockMany saw a deadlock:\n%s", out.String())
		}
		t.Log(out.String())
	}
}

// TestManyAccountsManyTellers runs transfers on disjoint account pairs at
// the same time (16 accounts, 16 tellers), which three accounts rarely
// allow. Under -race it checks that each balance is guarded by its
// account's key alone: a balance shared with other accounts (one map
// written for every pair) is a data race here, and without -race it can
// end in "concurrent map writes".
func TestManyAccountsManyTellers(t *testing.T) {
	const accounts, tellers, transfers = 16, 16, 300
	for _, mode := range []string{"lockmany", "ordered"} {
		t.Run(mode, func(t *testing.T) {
			var out strings.Builder
			if err := run(config{mode: mode, accounts: accounts, tellers: tellers, transfers: transfers}, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			for _, want := range []string{
				fmt.Sprintf("%d transfers by %d tellers over %d accounts", tellers*transfers, tellers, accounts),
				fmt.Sprintf("total balance before %d, after %d: conserved", accounts*1000, accounts*1000),
			} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
