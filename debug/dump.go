package debug

import (
	"bufio"
	"fmt"
	"io"
	"time"
)

// Dump writes every registered Locker's state as text, in the spirit of
// /debug/pprof/goroutine?debug=1: one block per Locker, its held keys
// longest held first, each with its holder and waiters in queue order.
// Long-held keys and long waits are marked "LONG". It returns the first
// write error.
//
//	fairlock "orders": 2 keys, 3 waiters, long-held after 100ms; 0 double unlocks, 1 reentrant, 0 deadlocks refused
//	  "order-17" held 2.31s by flow#12 LONG
//	      waiter 1: goroutine#55 waiting 2.3s LONG
//	      acquired at:
//	          main.handle /src/app/main.go:42
func Dump(w io.Writer) error {
	return writeText(w, Snapshot())
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
	fmt.Fprintf(w, "fairlock %q: %d keys, %d waiters", st.Name, st.Keys, st.Waiters)
	if st.LongHeld > 0 {
		fmt.Fprintf(w, ", long-held after %v", st.LongHeld)
	}
	fmt.Fprintf(w, "; %d double unlocks, %d reentrant, %d deadlocks refused\n",
		st.DoubleUnlocks, st.Reentrant, st.DeadlocksRefused)
	for _, k := range st.Held {
		fmt.Fprintf(w, "  %s held %s by %s%s\n", k.Key, human(k.HeldFor), k.Holder, mark(k.LongHeld))
		for i, wt := range k.Waiters {
			fmt.Fprintf(w, "      waiter %d: %s waiting %s%s\n", i+1, wt.Owner, human(wt.WaitFor), mark(wt.LongWait))
		}
		writeStack(w, "      acquired at:", k.Stack)
		for i, wt := range k.Waiters {
			writeStack(w, fmt.Sprintf("      waiter %d called Lock at:", i+1), wt.Stack)
		}
	}
}

func writeStack(w io.Writer, title string, frames []string) {
	if len(frames) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	for _, f := range frames {
		fmt.Fprintf(w, "          %s\n", f)
	}
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
