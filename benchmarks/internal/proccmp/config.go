package proccmp

import "time"

// Config sets what a comparison measures, the part every engine shares;
// each engine's Config embeds it and adds how its peers wait. The zero
// value of a field means its default (Defaults).
type Config struct {
	Rounds      int           // interleaved rounds
	Uncontended int           // Lock+Unlock pairs per lock and round
	HandOffs    int           // hand-offs per lock and round
	MaxHold     time.Duration // hand-off: the holder keeps the key a random time below this after the waiter queued
	HotDuration time.Duration // hot key: each timed run
	HotG        int           // hot key: goroutines in each of the three processes
	Waiters     int           // grant order: waiters queued per round, spread over three processes
	TTL         time.Duration // fairlock's session TTL, and the peers' expiry where they have one
	Bound       time.Duration // how long a waiting call waits at most
}

// Defaults is the shared part of the configuration of a full run of a
// comparison's command.
var Defaults = Config{
	Rounds:      5,
	Uncontended: 200,
	HandOffs:    20,
	MaxHold:     20 * time.Millisecond,
	HotDuration: 2 * time.Second,
	HotG:        4,
	Waiters:     9,
	TTL:         2 * time.Second,
}

// Quick is the shared part of a short configuration: one round with few
// samples, for CI's single run of the benchmarks.
var Quick = Config{
	Rounds:      1,
	Uncontended: 20,
	HandOffs:    3,
	HotDuration: 300 * time.Millisecond,
	Waiters:     6,
	TTL:         time.Second,
}

// WithDefaults returns c with its zero fields set from Defaults; Bound
// defaults to five TTLs, at least 10 s.
func (c Config) WithDefaults() Config {
	d := Defaults
	Default(&c.Rounds, d.Rounds)
	Default(&c.Uncontended, d.Uncontended)
	Default(&c.HandOffs, d.HandOffs)
	Default(&c.MaxHold, d.MaxHold)
	Default(&c.HotDuration, d.HotDuration)
	Default(&c.HotG, d.HotG)
	Default(&c.Waiters, d.Waiters)
	Default(&c.TTL, d.TTL)
	Default(&c.Bound, max(5*c.TTL, 10*time.Second))
	return c
}

// Default sets *x to v if *x is not positive: an engine's Config fills
// its own fields with it.
func Default[T int | time.Duration](x *T, v T) {
	if *x <= 0 {
		*x = v
	}
}
