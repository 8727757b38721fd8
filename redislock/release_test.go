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
// its release granted on the channel, and replies with those of the
// releasing session only, which its Locker grants without the notice's
// hop; a release that frees other sessions' Waits does not send their
// names back.
func TestReleaseRepliesOwnGrants(t *testing.T) {
	c := redistest.Start(t)
	ctx := context.Background()
	names := namesOf(escape("release"), "k")
	for _, sid := range []string{"a", "b"} {
		if err := c.Set(ctx, names.markers+sid, "p", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// a's holder; behind it Waits of b and a, then a's Lock and b's Lock.
	queue := []string{"a|1|x|0|0", "b|2|w|0|0", "a|3|w|0|0", "a|4|x|0|0", "b|5|x|0|0"}
	for i, m := range queue {
		if err := c.ZAdd(ctx, names.queue, redis.Z{Score: float64(i + 1), Member: m}).Err(); err != nil {
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
	if want := []any{int64(1), "a|3|w|0|0", "a|4|x|0|0"}; !slices.Equal(v, want) {
		t.Fatalf("release replied %v; want %v (the releasing session's grants only)", v, want)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(msg.Payload), queue[1:4]; !slices.Equal(got, want) {
		t.Fatalf("release announced %v; want %v (every entry it granted)", got, want)
	}
}
