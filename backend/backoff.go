package backend

import (
	"context"
	"time"
)

// Backoff paces retries of a round trip that failed: 50 ms doubling to
// 1 s. The kit paces re-reads of a queue with it, and engines their own
// retries (a watch, a subscription, a session's replacement).
type Backoff struct{ d time.Duration }

// NewBackoff returns a Backoff at its first delay.
func NewBackoff() *Backoff { return &Backoff{d: 50 * time.Millisecond} }

// Reset starts the delays again from the first: the last try succeeded.
func (b *Backoff) Reset() { b.d = 50 * time.Millisecond }

// Next returns the current delay and doubles it, up to 1 s.
func (b *Backoff) Next() time.Duration {
	d := b.d
	b.d = min(2*b.d, time.Second)
	return d
}

// Wait sleeps for the next delay; it reports false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
