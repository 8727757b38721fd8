package debug

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
)

// Dump writes every registered locker's state as text, in the spirit of
// /debug/pprof/goroutine?debug=1: one block per locker, its live keys
// longest held first, each with its holders and its waiters in queue
// order. Long-held keys and long waits are marked "LONG". Keys are
// rendered by the locker (strings quoted, control characters escaped),
// and owners' labels quoted the same way, so no key or label can forge a
// line. The count of deadlocks refused is shown only for a locker with a
// deadlock detector (fairlock.WithDeadlockDetection). It takes each
// locker's shard mutexes in turn and allocates in proportion to the live
// keys; it returns the first write error.
//
//	fairlock "orders" (Locker): 2 keys, 3 waiters, long-held after 100ms; 0 double unlocks, 1 reentrant, 0 deadlocks refused
//	  "order-17" exclusive, held 2.31s LONG
//	      holder: flow#12 "req-42" token 41 for 2.31s LONG
//	          main.handle /src/app/main.go:42
//	      waiter 1: goroutine#55 exclusive waiting 2.3s LONG
//
// A locker across processes (etcdlock, redislock) adds, for each of its
// keys, the calls of other processes ahead of its own, as it read them
// from its engine (KeyState.Ahead): where each was made (host:pid and
// the locker's name), its owner's label, its mode, its token if it
// holds the key, and how long ago it queued:
//
//	ahead 1: holder in web-2:4242 "redislock-1" "req-42" exclusive token 1718000000123456, queued 4.1s ago
func Dump(w io.Writer) error {
	return writeText(w, registry.Snapshot("", 0))
}

func writeText(w io.Writer, states []LockerState) error {
	bw := bufio.NewWriter(w)
	if len(states) == 0 {
		fmt.Fprintln(bw, "fairlock: no lockers built WithDebug are open")
	}
	for i, st := range states {
		if i > 0 {
			fmt.Fprintln(bw)
		}
		writeLocker(bw, st)
	}
	return bw.Flush()
}

func writeLocker(w io.Writer, st LockerState) {
	fmt.Fprintf(w, "fairlock %q (%s", st.Name, st.Kind)
	if st.Units > 0 {
		fmt.Fprintf(w, " of %s per key", count(st.Units, "unit"))
	}
	fmt.Fprintf(w, "): %s, %s", count(st.Keys, "key"), count(st.Waiters, "waiter"))
	if st.LongHeld > 0 {
		fmt.Fprintf(w, ", long-held after %v", st.LongHeld)
	}
	fmt.Fprintf(w, "; %s, %d reentrant", count(st.DoubleUnlocks, "double unlock"), st.Reentrant)
	if st.DeadlockDetection { // a locker without a detector refuses none
		fmt.Fprintf(w, ", %s refused", count(st.DeadlocksRefused, "deadlock"))
	}
	fmt.Fprintln(w)
	for _, k := range st.Held {
		fmt.Fprintf(w, "  %s %s", k.Key, k.Mode)
		if k.Units > 0 {
			fmt.Fprintf(w, " %d of %s", k.Units, count(st.Units, "unit"))
		}
		if len(k.Holders) > 0 {
			fmt.Fprintf(w, ", held %s%s", human(k.HeldFor), mark(k.LongHeld))
		}
		fmt.Fprintln(w)
		for _, h := range k.Holders {
			fmt.Fprintf(w, "      holder: %s token %d", ownerText(h.Owner, h.Label), h.Token)
			if h.Units > 0 {
				fmt.Fprintf(w, " (%s)", count(h.Units, "unit"))
			}
			fmt.Fprintf(w, " for %s%s\n", human(h.For), mark(h.LongHeld))
			writeStack(w, h.Stack)
		}
		for i, wt := range k.Waiters {
			fmt.Fprintf(w, "      waiter %d: %s %s", i+1, ownerText(wt.Owner, wt.Label), wt.Mode)
			if wt.Units > 0 {
				fmt.Fprintf(w, " (%s)", count(wt.Units, "unit"))
			}
			fmt.Fprintf(w, " waiting %s%s\n", human(wt.For), mark(wt.LongWait))
			writeStack(w, wt.Stack)
		}
		for i, a := range k.Ahead {
			role := "waiter"
			if a.Held {
				role = "holder"
			}
			fmt.Fprintf(w, "      ahead %d: %s in %s:%d %s", i+1, role, a.Host, a.PID, strconv.Quote(a.Locker))
			if a.Label != "" {
				fmt.Fprintf(w, " %s", strconv.Quote(a.Label))
			}
			fmt.Fprintf(w, " %s", a.Mode)
			if a.Units > 0 {
				fmt.Fprintf(w, " (%s)", count(a.Units, "unit"))
			}
			if a.Held {
				fmt.Fprintf(w, " token %d", a.Token)
			}
			fmt.Fprintf(w, ", queued %s ago\n", human(a.Age))
		}
		if k.AheadError != "" {
			fmt.Fprintf(w, "      ahead: not read (%s)\n", k.AheadError)
		}
	}
	if st.Omitted > 0 {
		fmt.Fprintf(w, "  … %d more %s left out\n", st.Omitted, noun(st.Omitted, "key"))
	}
}

// ownerText is an owner as the text dump shows it: its name, then its
// label quoted, as keys are, so that no label can forge a line:
// flow#3 "req-42".
func ownerText(name, label string) string {
	if label == "" {
		return name
	}
	return name + " " + strconv.Quote(label)
}

func writeStack(w io.Writer, frames []string) {
	for _, f := range frames {
		fmt.Fprintf(w, "          %s\n", f)
	}
}

// count writes n with its noun, singular for one: "1 key", "3 keys".
func count[N ~int | ~int64 | ~uint64](n N, one string) string {
	return fmt.Sprintf("%d %s", n, noun(n, one))
}

// noun is one for n == 1 and its plural (one + "s") otherwise.
func noun[N ~int | ~int64 | ~uint64](n N, one string) string {
	if n == 1 {
		return one
	}
	return one + "s"
}

func mark(long bool) string {
	if long {
		return " LONG"
	}
	return ""
}

// human rounds d to three significant figures: 2.31s, 812ms, 4.2µs.
func human(d time.Duration) string {
	for _, unit := range []time.Duration{time.Hour, time.Minute, time.Second, time.Millisecond, time.Microsecond} {
		if d >= unit {
			return d.Round(unit / 100).String()
		}
	}
	return d.String()
}
