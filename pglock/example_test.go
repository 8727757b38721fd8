package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/fairlock/fairlock/pglock"
	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A lock and the data it guards in one database: the holder's write is
// committed in a transaction that Fence proved current, and a grant that
// is no longer current (here unlocked; a paused or cut-off holder's whose
// session expired, alike) cannot fence a transaction at all. The example
// runs its own server with package pgtest (for tests and examples only);
// a program makes its pool from its own connection string.
func Example_fence() {
	srv, err := pgtest.NewServer()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.ConnString())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, cents bigint NOT NULL);
		INSERT INTO balances VALUES ('alice', 10000)`); err != nil {
		log.Fatal(err)
	}

	// New creates pglock's tables if they are missing (pglock.Schema).
	locks, err := pglock.New(pool, "locks/accounts")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	lease, err := locks.Lock(ctx, "alice")
	if err != nil {
		log.Fatal(err)
	}
	g := lease.(*pglock.Guard)
	withdraw := func(tx pgx.Tx) error {
		if err := g.Fence(ctx, tx); err != nil {
			return err // rolled back: the grant is no longer current
		}
		_, err := tx.Exec(ctx, `UPDATE balances SET cents = cents - 500 WHERE account = 'alice'`)
		return err
	}
	err = pgx.BeginFunc(ctx, pool, withdraw)
	fmt.Println("withdrawal under the lock:", err)
	// Unlock after the fenced transaction has ended, never inside it.
	if err := g.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, withdraw)
	fmt.Println("withdrawal after Unlock refused:", errors.Is(err, pglock.ErrLost))
	var cents int64
	if err := pool.QueryRow(ctx, `SELECT cents FROM balances WHERE account = 'alice'`).Scan(&cents); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", cents)
	// Output:
	// withdrawal under the lock: <nil>
	// withdrawal after Unlock refused: true
	// balance: 9500
}
