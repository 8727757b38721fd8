package proccmp

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOutOfOrder: a grant counts as out of order when a waiter that
// arrived before it still waits.
func TestOutOfOrder(t *testing.T) {
	for _, tc := range []struct {
		grants []int
		want   int
	}{
		{[]int{0, 1, 2, 3}, 0},
		{[]int{1, 0, 2, 3}, 1},
		{[]int{3, 2, 1, 0}, 3},
		{[]int{1, 2, 3, 0}, 3},
		{[]int{0, 2, 1, 3}, 1},
	} {
		if got := outOfOrder(tc.grants); got != tc.want {
			t.Errorf("outOfOrder(%v) = %d, want %d", tc.grants, got, tc.want)
		}
	}
}
