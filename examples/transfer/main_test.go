package main

import (
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
