package redislock

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReleaseRepliesOwnGrants: the release script announces every entry
// its release granted on the channel, and the Waits' bound, and replies
// with the bound and the granted entries of the releasing session only,
// which its Locker grants without the notice's hop; a release that frees
// other sessions' calls does not send their names back, and it names no
// Wait at all, however many: the bound stands for them, and their entries
// are gone with the release.
func TestReleaseRepliesOwnGrants(t *testing.T) {
	c := redistest.Start(t)
	ctx := context.Background()
	names := namesOf(escape("release"), "k")
	for _, sid := range []string{"a", "b"} {
		if err := c.Set(ctx, names.markers+sid, "p", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// a's holder; behind it Waits of b and a (kept apart), then a's
	// reader and b's reader, and a's Lock.
	queue := []string{"a|1|x|0|0", "b|2|w|0|0", "a|3|w|0|0", "a|4|r|0|0", "b|5|r|0|0", "a|6|x|0|0"}
	for i, m := range queue {
		z := names.queue
		if strings.Contains(m, "|w|") {
			z = names.waits
		}
		if err := c.ZAdd(ctx, z, redis.Z{Score: float64(i + 1), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	sub := c.Subscribe(ctx, "chan")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	v, err := runOnce(ctx, c, releaseScript, releaseSrc, []string{names.queue, names.markers + "a"},
		names.markers, "chan", "a|1|x|0|0", "a").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{int64(1), int64(4), "a|4|r|0|0"}; !slices.Equal(v, want) {
		t.Fatalf("release replied %v; want %v (the bound, and the releasing session's grants only)", v, want)
	}
	var got []string
	for range 2 {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msg.Payload)
	}
	if want := []string{"a|4|r|0|0 b|5|r|0|0", "@4 {release/k}"}; !slices.Equal(got, want) {
		t.Fatalf("release announced %q; want %q (every entry it granted, then the bound)", got, want)
	}
	if n, err := c.Exists(ctx, names.waits).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS %s: %d, %v; want the Waits whose turn came removed by the release", names.waits, n, err)
	}
}
