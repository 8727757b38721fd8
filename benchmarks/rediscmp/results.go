package rediscmp

import (
	"fmt"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// Results are the figures of a comparison: for each row and lock, one
// value per round; WriteText and WriteMarkdown print the table.
type Results = proccmp.Results

// Stat is a figure over the rounds: its median and range.
type Stat = proccmp.Stat

// waiting is the table header's sentence on how each lock waits.
func waiting(c Config) string {
	return fmt.Sprintf("Waiting: redislock WithTTL(%v), queued and woken by pub/sub; redsync WithExpiry(%v), WithTries(%d), WithRetryDelay(%v); bsm/redislock TTL %v, RetryStrategy ExponentialBackoff(%v, %v) under a context deadline of %v. The holders of redsync and bsm/redislock that are killed extend their lock every %v (Extend, Refresh), as redislock's session is renewed.", c.TTL, c.TTL, int(c.Bound/c.RedsyncDelay)+1, c.RedsyncDelay, c.TTL, c.BsmMin, c.BsmMax, c.Bound, (c.TTL / 3).Round(time.Millisecond))
}
