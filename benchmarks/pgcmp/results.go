package pgcmp

import (
	"fmt"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// Results are the figures of a comparison: for each row and lock, one
// value per round; WriteText and WriteMarkdown print the table.
type Results = proccmp.Results

// Stat is a figure over the rounds: its median and range.
type Stat = proccmp.Stat

// waiting is the table header's sentence on how each lock waits.
func waiting(c Config) string {
	return fmt.Sprintf("Waiting: pglock WithTTL(%v), queued and woken by LISTEN/NOTIFY, no connection held while waiting; pg_advisory_lock (a 64-bit FNV-1a hash of the key) blocking on a pooled connection of its own per waiter, held until the unlock; pg_try_advisory_lock retried every %v, its connection returned between tries; every wait bounded by %v.", c.TTL, c.PollDelay, c.Bound)
}
