package main

import (
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// names lists the implementations' names, comma-separated.
func names(impls []benchmarks.Impl) string {
	ns := make([]string, len(impls))
	for i, impl := range impls {
		ns[i] = impl.Name
	}
	return strings.Join(ns, ", ")
}

// TestRunOrder checks that as many rounds as there are implementations put
// each implementation in each place once, that every round measures all
// of them, and that the first round keeps Impls' order.
func TestRunOrder(t *testing.T) {
	impls := benchmarks.Impls()
	n := len(impls)
	if got := names(runOrder(impls, 0)); got != names(impls) {
		t.Errorf("round 0 order = %s, want Impls' order %s", got, names(impls))
	}
	places := map[string]map[int]bool{}
	for round := range n {
		order := runOrder(impls, round)
		if len(order) != n {
			t.Fatalf("round %d measures %d implementations, want %d", round, len(order), n)
		}
		for place, impl := range order {
			if places[impl.Name] == nil {
				places[impl.Name] = map[int]bool{}
			}
			if places[impl.Name][place] {
				t.Errorf("%s takes place %d twice in %d rounds", impl.Name, place, n)
			}
			places[impl.Name][place] = true
		}
	}
	for _, impl := range impls {
		if len(places[impl.Name]) != n {
			t.Errorf("%s took %d of the %d places over %d rounds", impl.Name, len(places[impl.Name]), n, n)
		}
	}
	if impls[0].Name != "fairlock" {
		t.Errorf("runOrder rotated Impls' own slice: it now starts with %s", impls[0].Name)
	}
}

// fakeImpls are three implementations that are never run: measure only
// passes them to the scenarios' functions.
var fakeImpls = []benchmarks.Impl{{Name: "fairlock"}, {Name: "peer"}, {Name: "one-key", SingleKey: true}}

// TestMeasureRounds checks that measure runs every scenario once per
// round for each implementation that takes part, in the order of those
// rotated by the round, and a once scenario in the first round only.
func TestMeasureRounds(t *testing.T) {
	var calls []string
	rec := func(tag string) func(benchmarks.Impl) []float64 {
		return func(i benchmarks.Impl) []float64 {
			calls = append(calls, tag+":"+i.Name)
			return []float64{float64(len(calls))}
		}
	}
	scs := []scenario{
		{title: "a", metrics: []metric{timeOp}, takes: func(benchmarks.Impl) bool { return true }, measure: rec("a")},
		{title: "b", metrics: []metric{timeOp}, takes: func(i benchmarks.Impl) bool { return !i.SingleKey }, measure: rec("b"), once: true},
		{title: "c", metrics: []metric{timeOp}, takes: func(i benchmarks.Impl) bool { return i.Name != "peer" }, measure: rec("c")},
	}
	m := measure(settings{rounds: 3, run: time.Millisecond}, fakeImpls, scs, io.Discard)
	want := []string{
		"a:fairlock", "a:peer", "a:one-key", "b:fairlock", "b:peer", "c:fairlock", "c:one-key",
		"a:peer", "a:one-key", "a:fairlock", "c:one-key", "c:fairlock",
		"a:one-key", "a:fairlock", "a:peer", "c:fairlock", "c:one-key",
	}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if got := m.values["a"]["fairlock"]; len(got) != 3 || got[0][0] != 1 || got[1][0] != 10 || got[2][0] != 14 {
		t.Errorf("scenario a, fairlock: %v, want the values of calls 1, 10 and 14", got)
	}
	if _, ok := m.values["b"]["one-key"]; ok {
		t.Errorf("scenario b measured an implementation it does not take")
	}
}

func TestSummarize(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		xs   []float64
		want stat
	}{
		{[]float64{3}, stat{3, 3, 3, true}},
		{[]float64{5, 1, 3}, stat{3, 1, 5, true}},
		{[]float64{4, 1, 3, 2}, stat{2.5, 1, 4, true}},
		{[]float64{nan, 7, 2, nan}, stat{4.5, 2, 7, true}},
		{[]float64{nan}, stat{}},
		{nil, stat{}},
	} {
		if got := summarize(c.xs); got != c.want {
			t.Errorf("summarize(%v) = %+v, want %+v", c.xs, got, c.want)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct {
		f    func(float64) (string, string)
		x    float64
		want string
	}{
		{fmtDuration, 26.23, "26.2ns"},
		{fmtDuration, 999.7, "1.00µs"},
		{fmtDuration, 82_240, "82.2µs"},
		{fmtDuration, 171_200, "171µs"},
		{fmtDuration, 1_170_000, "1.17ms"},
		{fmtDuration, 31_970_000, "32.0ms"},
		{fmtRate, 912.4, "912"},
		{fmtRate, 22_063, "22.1k"},
		{fmtRate, 319_896, "320k"},
		{fmtRate, 1_234_000, "1.23M"},
		{fmtCPU, 5.123, "5.12 s"},
		{fmtJain, 0.9996, "1.000"},
		{fmtMiB, 139_221_729, "133 MiB"},
		{fmtBytes, 190.6, "191 B"},
		{fmtPercent, 0.1234, "12.3%"},
	} {
		num, unit := c.f(c.x)
		if got := num + unit; got != c.want {
			t.Errorf("format(%v) = %q, want %q", c.x, got, c.want)
		}
	}
}

// TestSig3: ratios keep three significant digits at every scale, so two
// small ratios that differ are not printed alike.
func TestSig3(t *testing.T) {
	for x, want := range map[float64]string{
		0.0167: "0.0167", 0.0215: "0.0215", 0.0099: "0.00990", 0.0749: "0.0749",
		0.713: "0.713", 0.1: "0.100", 0.9997: "1.00", 2.314: "2.31", 45.24: "45.2", 812.4: "812", 9253: "9253", 999.5: "1000",
	} {
		if got := sig3(x); got != want {
			t.Errorf("sig3(%v) = %q, want %q", x, got, want)
		}
	}
}

// TestValue checks a figure's cell: the range left out when the rounds
// agree, its units left out when they are the median's.
func TestValue(t *testing.T) {
	for _, c := range []struct {
		st   stat
		want string
	}{
		{stat{82_240, 80_100, 84_000, true}, "82.2µs (80.1–84.0)"},
		{stat{1_170_000, 987_000, 1_310_000, true}, "1.17ms (987µs–1.31ms)"},
		{stat{26.2, 26.21, 26.24, true}, "26.2ns"},
		{stat{}, "n/a"},
	} {
		if got := value(fmtDuration, c.st); got != c.want {
			t.Errorf("value(%+v) = %q, want %q", c.st, got, c.want)
		}
	}
	if got := ratio(stat{26.2, 0, 0, true}, stat{71.6, 0, 0, true}); got != "0.366×" {
		t.Errorf("ratio = %q, want 0.366×", got)
	}
	if got := ratio(stat{0.11, 0, 0, true}, stat{53.7, 0, 0, true}); got != "0.00205×" {
		t.Errorf("ratio of 0.11 to 53.7 = %q, want 0.00205×", got)
	}
	if got := ratio(stat{26.2, 0, 0, true}, stat{}); got != "n/a" {
		t.Errorf("ratio against no figure = %q, want n/a", got)
	}
}

// fakeMeasured is a run of two rounds over fakeImpls: a headline scenario
// all three took part in, with a CPU figure the platform did not report
// for the peer, and a second scenario without one-key.
func fakeMeasured() measured {
	nan := math.NaN()
	return measured{
		machine: "Test CPU, 2 CPUs", rounds: 2, run: 500 * time.Millisecond, impls: fakeImpls,
		scenarios: []scenario{
			{title: "3. Hot key", label: "hot key G=32", table: headlineTable, metrics: []metric{opsPerSec, cpuPerM, jain}},
			{title: "5. Zipf", label: "Zipf keys", table: otherTable, metrics: []metric{opsPerSec}},
		},
		values: map[string]map[string][][]float64{
			"3. Hot key": {
				"fairlock": {{320_000, 5.0, 1}, {310_000, 5.2, 1}},
				"peer":     {{400_000, nan, 0.9}, {400_000, nan, 0.8}},
				"one-key":  {{420_000, 4.0, 0.95}, {410_000, 4.0, 0.95}},
			},
			"5. Zipf": {
				"fairlock": {{700_000}, {720_000}},
				"peer":     {{800_000}, {800_000}},
			},
		},
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b strings.Builder
	writeMarkdown(&b, fakeMeasured())
	got := b.String()
	for _, want := range []string{
		"Machine: Test CPU, 2 CPUs. One `compare -markdown` run: 2 interleaved rounds, 500ms per timed run.",
		"| | fairlock | peer | one-key |\n| --- | --- | --- | --- |\n",
		"| hot key G=32: ops/s | 315k (310–320) | 400k · 0.787× | 415k (410–420) · 0.759× |\n",
		"| hot key G=32: CPU s/10⁶ grants | 5.10 s (5.00–5.20) | n/a | 4.00 s · 1.27× |\n",
		"| hot key G=32: Jain | 1.000 | 0.850 (0.800–0.900) | 0.950 |\n",
		"| | fairlock | peer |\n| --- | --- | --- |\n| Zipf keys: ops/s | 710k (700–720) | 800k · 0.887× |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("markdown lacks\n%s\nin\n%s", want, got)
		}
	}
	if strings.Index(got, "hot key G=32") > strings.Index(got, "Zipf keys") {
		t.Errorf("the headline table does not come first:\n%s", got)
	}
}

func TestWriteText(t *testing.T) {
	var b strings.Builder
	writeText(&b, fakeMeasured())
	lines := strings.Split(b.String(), "\n")
	want := map[string]string{
		"ops/s":            "315k (310–320) 400k 415k (410–420)",
		"fairlock ÷ peer":  "0.787× 0.759×",
		"CPU s/10⁶ grants": "5.10 s (5.00–5.20) n/a 4.00 s",
		"Jain":             "1.000 0.850 (0.800–0.900) 0.950",
	}
	for i, l := range lines {
		if !strings.Contains(l, "Hot key") {
			continue
		}
		for _, l := range lines[i+1:] {
			f := strings.Fields(l)
			for prefix, cells := range want {
				if rest, ok := strings.CutPrefix(strings.Join(f, " "), prefix+" "); ok {
					if rest != cells {
						t.Errorf("row %q = %q, want %q", prefix, rest, cells)
					}
					delete(want, prefix)
				}
			}
		}
		break
	}
	for prefix := range want {
		t.Errorf("no row %q in\n%s", prefix, b.String())
	}
}

// TestCCDFPoints checks that the curve starts at every call, falls to
// the single longest wait, and never rises.
func TestCCDFPoints(t *testing.T) {
	waits := make([]time.Duration, 10_000)
	for i := range waits {
		waits[i] = time.Duration(i) * time.Microsecond
	}
	pts := ccdfPoints(waits)
	if pts[0].Y != 1 || pts[0].X != 0.1 {
		t.Errorf("first point %v, want (0.1, 1): every call waited at least nothing", pts[0])
	}
	if last := pts[len(pts)-1]; last.Y != 1.0/10_000 || last.X != 9999 {
		t.Errorf("last point %v, want (9999, 1e-4): the longest wait alone", last)
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].X < pts[i-1].X || pts[i].Y >= pts[i-1].Y {
			t.Fatalf("points %d and %d: %v then %v; want x rising and y falling", i-1, i, pts[i-1], pts[i])
		}
	}
}

// TestPlots writes both plots from a little data and checks that each is
// a PNG.
func TestPlots(t *testing.T) {
	pd := newPlotData(true)
	for _, g := range hotKeyGs {
		for k, impl := range benchmarks.Impls() {
			for r := range 2 {
				pd.add(g, impl.Name, benchmarks.Contended{
					Ops: 1000 * (k + 1) * (r + 1), Elapsed: time.Second,
					Waits: []time.Duration{0, time.Microsecond, time.Duration(k+1) * time.Millisecond},
				})
			}
		}
	}
	paths, err := pd.plot(t.TempDir(), benchmarks.Impls())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "\x89PNG") {
			t.Errorf("%s is not a PNG", filepath.Base(p))
		}
	}
}

// TestScenarioTakes checks who takes part in what: scenarios 1 to 7 take
// no peer of the other modes, and each scenario of the modes table takes
// fairlock and the peer of its mode, nothing else.
func TestScenarioTakes(t *testing.T) {
	impls := append(benchmarks.Impls(), benchmarks.ModePeers()...)
	var modes []string
	for _, sc := range scenarios(settings{run: time.Millisecond, churn: 10}, newPlotData(false)) {
		var got []string
		for _, impl := range impls {
			if sc.takes(impl) {
				got = append(got, impl.Name)
			}
		}
		if sc.table != modesTable {
			for _, peer := range benchmarks.ModePeers() {
				if slices.Contains(got, peer.Name) {
					t.Errorf("%q takes %s, which has no exclusive lock", sc.title, peer.Name)
				}
			}
			continue
		}
		modes = append(modes, sc.label)
		want := []string{"fairlock", "x/sync semaphore map"}
		if strings.HasPrefix(sc.title, "8. ") || strings.HasPrefix(sc.title, "10. ") {
			want[1] = "sync.RWMutex map"
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q takes %q, want %q", sc.title, got, want)
		}
	}
	wantModes := []string{
		"uncontended", "uncontended", "read-mostly G=8", "read-mostly G=32",
		"semaphore G=8", "semaphore G=32", "semaphore G=32, 1–3 units",
	}
	if !slices.Equal(modes, wantModes) {
		t.Errorf("the modes table's scenarios are %q, want %q", modes, wantModes)
	}
}

// TestModeScenariosRun runs scenarios 8 to 11 for a little while, the
// uncontended ones once each, and checks that every row of their text
// tables and of the third markdown table is there with a figure for every
// lock that takes part, and "—" for the one that does not.
func TestModeScenariosRun(t *testing.T) {
	old := flag.Lookup("test.benchtime").Value.String()
	if err := flag.Set("test.benchtime", "1x"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set("test.benchtime", old) })
	s := settings{rounds: 2, run: 20 * time.Millisecond}
	m := measure(s, append(benchmarks.Impls(), benchmarks.ModePeers()...), modeScenarios(s), io.Discard)

	var text strings.Builder
	writeText(&text, m)
	for _, sc := range m.scenarios {
		present := m.present(sc)
		if len(present) != 2 || present[0] != "fairlock" {
			t.Errorf("%q: measured %q, want fairlock and one peer", sc.title, present)
			continue
		}
		if !strings.Contains(text.String(), sc.title+"\n") {
			t.Errorf("no table %q in the text", sc.title)
		}
		for j, mt := range sc.metrics {
			for _, impl := range present {
				st, _ := m.stat(sc, j, impl)
				if !st.ok && mt.name != cpuPerM.name { // CPU time is Unix only
					t.Errorf("%q, %s: no %s", sc.title, impl, mt.name)
				}
			}
		}
	}

	var md strings.Builder
	writeMarkdown(&md, m)
	tables := strings.Split(md.String(), "\n\n")
	if len(tables) != 2 {
		t.Fatalf("markdown: %d paragraphs, want the sentence and one table:\n%s", len(tables), md.String())
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(tables[1]), "\n") {
		cells := strings.Split(line, "|")
		cells = cells[1 : len(cells)-1] // the line begins and ends with |
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[cells[0]] = cells[1:]
	}
	if got := rows[""]; !slices.Equal(got, []string{"fairlock", "sync.RWMutex map", "x/sync semaphore map"}) {
		t.Errorf("markdown columns %q", got)
	}
	for _, c := range []struct {
		row    string
		absent int // the column of the lock that takes no part
	}{
		{"uncontended: RLock+Unlock time/op", 2},
		{"uncontended: RLock+Unlock allocs/op", 2},
		{"uncontended: Lock+Unlock time/op", 2},
		{"uncontended: Acquire(1)+Unlock time/op", 1},
		{"read-mostly G=8: reads/s", 2},
		{"read-mostly G=32: writes/s", 2},
		{"read-mostly G=8: writers' share", 2},
		{"read-mostly G=32: reader wait p99", 2},
		{"read-mostly G=32: writer wait max", 2},
		{"read-mostly G=8: Jain", 2},
		{"semaphore G=8: grants/s", 1},
		{"semaphore G=32: wait p99", 1},
		{"semaphore G=32, 1–3 units: Jain", 1},
	} {
		cells, ok := rows[c.row]
		if !ok {
			t.Errorf("markdown: no row %q in\n%s", c.row, md.String())
			continue
		}
		for i, cell := range cells {
			if (i == c.absent) != (cell == "—") {
				t.Errorf("markdown row %q: cell %d is %q", c.row, i, cell)
			}
		}
	}
}
