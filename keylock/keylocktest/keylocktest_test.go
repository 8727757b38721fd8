package keylocktest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// perTest keeps one value per test, made on first use.
type perTest[V any] struct {
	mu   sync.Mutex
	m    map[testing.TB]V
	make func(t testing.TB) V
}

func (p *perTest[V]) get(t testing.TB) V {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[t]
	if !ok {
		if p.m == nil {
			p.m = map[testing.TB]V{}
		}
		v = p.make(t)
		p.m[t] = v
		t.Cleanup(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			delete(p.m, t)
		})
	}
	return v
}

// closeLocker closes l (a Locker or Semaphore), failing t if a grant is
// still held after a bound: the suite has released all it holds by then,
// so a grant left is one the backend kept, and an unbounded Close would
// hang the test.
func closeLocker(t testing.TB, l interface{ Close(context.Context) error }) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// toyHarness runs the suite on a toy of policy p: one toy per test, a
// toyLocker per New, Lose loses the grant.
func toyHarness(p policy) keylocktest.Harness {
	toys := &perTest[*toy]{make: func(testing.TB) *toy { return newToy(p) }}
	return keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker {
			l := toys.get(t).locker()
			t.Cleanup(func() { closeLocker(t, l) })
			return l
		},
		Waiters: func(t testing.TB, key string) int { return toys.get(t).waiters(key) },
		Lose:    func(t testing.TB, l keylock.Lease) { l.(*toyLease).lose() },
	}
}

// toyCallsHarness is toyHarness with Calls instead of Waiters: calls
// holding or queued, as a distributed backend counts the entries in a
// key's range.
func toyCallsHarness() keylocktest.Harness {
	toys := &perTest[*toy]{make: func(testing.TB) *toy { return newToy(fifo) }}
	h := toyHarness(fifo)
	h.New = func(t testing.TB) keylock.Locker {
		l := toys.get(t).locker()
		t.Cleanup(func() { closeLocker(t, l) })
		return l
	}
	h.Waiters = nil
	h.Calls = func(t testing.TB, key string) int {
		b := toys.get(t)
		b.mu.Lock()
		defer b.mu.Unlock()
		k := b.keys[key]
		if k == nil {
			return 0
		}
		n := len(k.queue)
		if k.holder != nil {
			n++
		}
		return n
	}
	return h
}

// independentHarness returns Lockers that do not exclude each other: a
// new fairlock.Locker per New. Waiters sums them all.
func independentHarness() keylocktest.Harness {
	all := &perTest[*[]*fairlock.Locker[string]]{make: func(testing.TB) *[]*fairlock.Locker[string] { return new([]*fairlock.Locker[string]) }}
	return keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker {
			l := fairlock.New[string]()
			ls := all.get(t)
			all.mu.Lock()
			*ls = append(*ls, l)
			all.mu.Unlock()
			t.Cleanup(func() { closeLocker(t, l) })
			return keylock.InProcess(l)
		},
		Waiters: func(t testing.TB, key string) int {
			ls := all.get(t)
			all.mu.Lock()
			defer all.mu.Unlock()
			n := 0
			for _, l := range *ls {
				n += l.Waiters(key)
			}
			return n
		},
	}
}

// TestRunOnToy runs the suite on the toy with its fair policy, with
// Waiters and with Calls: the control for TestRunFailsOnBrokenLockers,
// and the suite's run of Lost and of the Calls count.
func TestRunOnToy(t *testing.T) {
	t.Run("Waiters", func(t *testing.T) { keylocktest.Run(t, toyHarness(fifo)) })
	t.Run("Calls", func(t *testing.T) { keylocktest.Run(t, toyCallsHarness()) })
}

// TestRunFailsOnBrokenLockers shows that the suite can fail: it runs
// Run, in a child process (Run takes a *testing.T, and a failing
// *testing.T fails its test), against Lockers that break one promise
// each, and checks that the child failed in the check for it: the toy
// barging, serving the newest waiter first, or forgetting a loss;
// Lockers that do not exclude each other; and in-process views wrapped
// to return a typed nil Lease, to share no reads, or to take any weight.
// The fair toy and the unwrapped views pass in the same child, so the
// failures come from the breakage.
func TestRunFailsOnBrokenLockers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for _, c := range []struct {
		broken string
		want   []string // checks that must fail
	}{
		{"fifo", nil},      // the control for the toy
		{"inprocess", nil}, // the control for the wrapped in-process lock
		{"barge", []string{"TryLockNeverOvertakes"}},
		{"lifo", []string{"FIFO", "Wait"}},
		{"independent", []string{"Exclusion", "FIFO", "TryLockNeverOvertakes", "Cancellation", "Unlock", "Tokens", "Wait", "Do", "LockMany"}},
		{"forgetloss", []string{"Lost"}},
		{"zerodeadline", []string{"Deadline", "Lost"}},
		{"fakehandoff", []string{"HandOff"}},
		{"typednil", []string{"Exclusion", "TryLockNeverOvertakes", "Reentrant", "Cancellation", "Unlock", "Wait", "Do", "Close", "Shared"}},
		{"tryrlockexclusive", []string{"Shared"}},
		{"anyweight", []string{"Semaphore"}},
		{"neither", []string{}}, // Run itself fails at once
	} {
		t.Run(c.broken, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenChild$", "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.broken)
			out, err := cmd.CombinedOutput()
			failed := failedChecks(string(out))
			t.Logf("%s: checks failed: %q", c.broken, failed)
			if c.want == nil {
				if err != nil {
					t.Fatalf("the suite failed on the fair toy (%v):\n%s", err, out)
				}
				return
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("the child passed on Lockers that are %s (%v):\n%s", c.broken, err, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenChild") {
				t.Fatalf("the child did not fail TestBrokenChild:\n%s", out)
			}
			for _, name := range c.want {
				if !slices.Contains(failed, name) {
					t.Errorf("check %s passed on Lockers that are %s; the child's output:\n%s", name, c.broken, out)
				}
			}
			if c.broken == "neither" && !strings.Contains(string(out), "sets neither Waiters nor Calls") {
				t.Errorf("no word of the missing Waiters and Calls:\n%s", out)
			}
		})
	}
}

const brokenEnv = "KEYLOCKTEST_BROKEN"

// failedChecks lists the checks of TestBrokenChild that failed, by the
// "--- FAIL: TestBrokenChild/NAME" lines of go test -v.
func failedChecks(out string) []string {
	var names []string
	for _, m := range regexp.MustCompile(`--- FAIL: TestBrokenChild/(\S+)`).FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	return names
}

// TestBrokenChild is the child of TestRunFailsOnBrokenLockers; run
// directly, it skips.
func TestBrokenChild(t *testing.T) {
	var h keylocktest.Harness
	switch broken := os.Getenv(brokenEnv); broken {
	case "":
		t.Skip("run by TestRunFailsOnBrokenLockers")
	case "fifo", "barge", "lifo", "forgetloss", "zerodeadline", "fakehandoff":
		h = toyHarness(policy(broken))
	case "inprocess":
		h = wrappedHarness(unwrappedLocker, unwrappedSemaphore)
	case "typednil":
		h = wrappedHarness(func(l keylock.RWLocker) keylock.Locker { return typedNil{l} }, unwrappedSemaphore)
	case "tryrlockexclusive":
		h = wrappedHarness(func(l keylock.RWLocker) keylock.Locker { return tryRLockExclusive{l} }, unwrappedSemaphore)
	case "anyweight":
		h = wrappedHarness(unwrappedLocker, func(s keylock.Semaphore, n int64) keylock.Semaphore { return anyWeight{s, n} })
	case "independent":
		h = independentHarness()
	case "neither":
		h = toyHarness(fifo)
		h.Waiters = nil
	default:
		t.Fatalf("unknown %s=%q", brokenEnv, broken)
	}
	keylocktest.Run(t, h)
}

// TestRunOnInProcess runs the suite with the harness of the package doc,
// as written there.
func TestRunOnInProcess(t *testing.T) {
	var mu sync.Mutex
	lockers := map[testing.TB]*fairlock.Locker[string]{}
	locker := func(t testing.TB) *fairlock.Locker[string] {
		mu.Lock()
		defer mu.Unlock()
		l, ok := lockers[t]
		if !ok {
			l = fairlock.New[string]()
			lockers[t] = l
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := l.Close(ctx); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		}
		return l
	}
	keylocktest.Run(t, keylocktest.Harness{
		New:     func(t testing.TB) keylock.Locker { return keylock.InProcess(locker(t)) },
		Waiters: func(t testing.TB, key string) int { return locker(t).Waiters(key) },
	})
}
