package pglock

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkWaitsReleased: a holder's release with 200 Waits queued
// behind it through four Lockers on pools of their own: the time from
// its Unlock to the return of the last Wait (ns/op, ms/release), beside
// the release with one Wait queued (ms/release-of-1) and a round trip to
// the server (SELECT 1, ms/round-trip), medians of interleaved runs, and
// their ratios; in-process, the same on one fairlock.Locker
// (disttest.WaitsReleased).
//
//	go test -run '^$' -bench WaitsReleased -benchtime 20x
func BenchmarkWaitsReleased(b *testing.B) {
	const waits = 200
	b.Run("in-process", func(b *testing.B) { disttest.WaitsReleasedInProcess(b, waits) })
	b.Run("postgres", func(b *testing.B) {
		srv := server(b)
		admin := srv.NewPool(b)
		if err := ensureSchema(context.Background(), admin); err != nil {
			b.Fatal(err)
		}
		prefix := "bench#" + b.Name()
		var ls []keylock.Locker
		for range 5 {
			ls = append(ls, newLocker(b, srv.NewPool(b, func(c *pgxpool.Config) { c.MaxConns = 8 }), prefix))
		}
		calls := func(key string) int { return rowsOf(b, admin, key, prefix) }
		disttest.WaitsReleased(b, waits, ls, calls, func(ctx context.Context) error {
			var one int
			return admin.QueryRow(ctx, "SELECT 1").Scan(&one)
		})
	})
}
