package proccmp

import (
	"fmt"
	"math"
	"strconv"
)

// value formats a Stat as "median (lo–hi)", the range left out when every
// round gave the same figure.
func value(f func(float64) (string, string), st Stat) string {
	if st.N == 0 {
		return "n/a"
	}
	num, unit := f(st.Med)
	loN, loU := f(st.Lo)
	hiN, hiU := f(st.Hi)
	if loN+loU == hiN+hiU {
		return num + unit
	}
	if loU == unit && hiU == unit {
		return fmt.Sprintf("%s%s (%s–%s)", num, unit, loN, hiN)
	}
	return fmt.Sprintf("%s%s (%s%s–%s%s)", num, unit, loN, loU, hiN, hiU)
}

// sig3 formats x to three significant digits (whole numbers from 1000).
func sig3(x float64) string {
	if x == 0 {
		return "0"
	}
	if math.Abs(x) >= 999.5 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	decimals := 2 - int(math.Floor(math.Log10(math.Abs(r))))
	return strconv.FormatFloat(r, 'f', max(decimals, 0), 64)
}

// fmtDuration formats nanoseconds in µs, ms or s; +Inf (a waiter that
// was never granted) as "never".
func fmtDuration(ns float64) (string, string) {
	switch {
	case math.IsInf(ns, 1):
		return "never", ""
	case ns >= 999.5e6:
		return sig3(ns / 1e9), "s"
	case ns >= 999.5e3:
		return sig3(ns / 1e6), "ms"
	case ns >= 999.5:
		return sig3(ns / 1e3), "µs"
	default:
		return sig3(ns), "ns"
	}
}

// fmtRate formats a rate per second, in thousands above 10⁴.
func fmtRate(x float64) (string, string) {
	if x >= 1e4 {
		return sig3(x / 1e3), "k"
	}
	return strconv.FormatFloat(x, 'f', 0, 64), ""
}

func fmtJain(x float64) (string, string)  { return strconv.FormatFloat(x, 'f', 3, 64), "" }
func fmtCount(x float64) (string, string) { return strconv.FormatFloat(x, 'f', 0, 64), "" }
