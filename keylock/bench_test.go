package keylock_test

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// BenchmarkInProcess sets an uncontended Lock+Unlock through the
// keylock interface beside the direct call on the same Locker, and Do
// beside both: the interface's price is the Lease (one allocation) and
// two dynamic calls.
func BenchmarkInProcess(b *testing.B) {
	ctx := context.Background()
	l := fairlock.New[string]()
	b.Cleanup(func() { _ = l.Close(ctx) })
	v := keylock.InProcess(l)
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g, err := l.Lock(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			g.Unlock()
		}
	})
	b.Run("keylock", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g, err := v.Lock(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			_ = g.Unlock(ctx)
		}
	})
	b.Run("Do", func(b *testing.B) {
		b.ReportAllocs()
		lock := v.Lock
		fn := func(context.Context, keylock.Lease) error { return nil }
		for b.Loop() {
			if err := keylock.Do(ctx, lock, "k", fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
