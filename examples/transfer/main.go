// Command transfer moves money between bank accounts concurrently, each
// transfer locking both accounts with a fairlock Locker, in two modes:
//
//   - lockmany (default): fairlock.LockMany takes both keys in sorted
//     order, so no two transfers can deadlock, and every transfer succeeds
//     on its first try.
//   - ordered: each transfer locks "from" then "to", in request order, the
//     way hand-written code usually does. Opposite transfers (A→B while
//     B→A) would deadlock; with fairlock.WithDeadlockDetection the Lock that
//     would close the cycle returns ErrDeadlock at once, and the transfer
//     releases what it holds and retries: a hang becomes a retry.
//
// Either way the total balance is unchanged at the end, which the program
// checks and prints.
//
//	go run ./examples/transfer
//	go run ./examples/transfer -mode ordered
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

type config struct {
	mode      string
	accounts  int
	tellers   int
	transfers int // per teller
}

func main() {
	var cfg config
	flag.StringVar(&cfg.mode, "mode", "lockmany", "lockmany, or ordered (one key at a time, deadlock detection on)")
	flag.IntVar(&cfg.accounts, "accounts", 4, "accounts (few accounts make opposite transfers common)")
	flag.IntVar(&cfg.tellers, "tellers", 8, "concurrent tellers, each its own flow")
	flag.IntVar(&cfg.transfers, "transfers", 500, "transfers per teller")
	flag.Parse()
	if err := run(cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// bank is the shared state. A per-key lock guards only what belongs to its
// key: here each account's balance, behind its own pointer. The accounts
// map itself is built before the tellers start and only read after that,
// so tellers that lock disjoint pairs of accounts never write the same
// memory. (Writing a shared map under per-key locks would be a data race:
// two transfers on disjoint pairs hold different keys and would write the
// map at the same time.)
type bank struct {
	locks    *fairlock.Locker[string]
	accounts map[string]*account // read-only once the tellers start
}

// account is one account's state.
type account struct {
	balance int // guarded by the account's key in bank.locks
}

// outcome counts what the tellers saw.
type outcome struct {
	done, retries, deadlocks atomic.Int64
}

func run(cfg config, out io.Writer) error {
	if cfg.mode != "lockmany" && cfg.mode != "ordered" {
		return fmt.Errorf("unknown -mode %q (want lockmany or ordered)", cfg.mode)
	}
	if cfg.accounts < 2 {
		return errors.New("need at least 2 accounts")
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // refusals are counted below instead
	b := &bank{
		locks:    fairlock.New[string](fairlock.WithName("accounts"), fairlock.WithDeadlockDetection(), fairlock.WithLogger(quiet)),
		accounts: make(map[string]*account, cfg.accounts),
	}
	for i := range cfg.accounts {
		b.accounts[fmt.Sprintf("acct-%d", i)] = &account{balance: 1000}
	}
	before := b.total()

	var res outcome
	var wg sync.WaitGroup
	errs := make(chan error, cfg.tellers)
	for teller := range cfg.tellers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := owner.NewContext(context.Background()) // each teller is one flow
			rng := rand.New(rand.NewPCG(uint64(teller), 42))
			for range cfg.transfers {
				from := rng.IntN(cfg.accounts)
				to := (from + 1 + rng.IntN(cfg.accounts-1)) % cfg.accounts
				err := b.transfer(ctx, cfg.mode, fmt.Sprintf("acct-%d", from), fmt.Sprintf("acct-%d", to), 1+rng.IntN(20), &res)
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	after := b.total()
	fmt.Fprintf(out, "mode %s: %d transfers by %d tellers over %d accounts\n", cfg.mode, res.done.Load(), cfg.tellers, cfg.accounts)
	fmt.Fprintf(out, "deadlocks refused (ErrDeadlock): %d, retries: %d\n", res.deadlocks.Load(), res.retries.Load())
	fmt.Fprintf(out, "total balance before %d, after %d: %s\n", before, after, map[bool]string{true: "conserved", false: "BROKEN"}[before == after])
	if before != after {
		return errors.New("balance not conserved")
	}
	return b.locks.Close(context.Background())
}

// transfer moves amount from one account to another, retrying after
// ErrDeadlock in ordered mode.
func (b *bank) transfer(ctx context.Context, mode, from, to string, amount int, res *outcome) error {
	for {
		release, err := b.lockPair(ctx, mode, from, to)
		if errors.Is(err, fairlock.ErrDeadlock) {
			// Our Lock would have closed a cycle: we hold from and someone
			// holding to waits for from. Back off (lockPair released
			// everything) and try again.
			res.deadlocks.Add(1)
			res.retries.Add(1)
			continue
		}
		if err != nil {
			return err
		}
		// Both keys are held: these two accounts, and nothing else, are
		// ours to write. The map is only read.
		b.accounts[from].balance -= amount
		b.accounts[to].balance += amount
		release()
		res.done.Add(1)
		return nil
	}
}

// lockPair locks both accounts and returns the function that unlocks them.
func (b *bank) lockPair(ctx context.Context, mode, from, to string) (func(), error) {
	if mode == "lockmany" {
		m, err := fairlock.LockMany(ctx, b.locks, from, to)
		return m.Unlock, err
	}
	gf, err := b.locks.Lock(ctx, from)
	if err != nil {
		return nil, err
	}
	gt, err := b.locks.Lock(ctx, to)
	if err != nil {
		gf.Unlock()
		return nil, err
	}
	return func() { gt.Unlock(); gf.Unlock() }, nil
}

// total sums the balances; it is called only while no teller runs.
func (b *bank) total() int {
	sum := 0
	for _, a := range b.accounts {
		sum += a.balance
	}
	return sum
}
