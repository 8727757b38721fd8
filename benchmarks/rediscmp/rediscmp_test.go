package rediscmp

import (
	"testing"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp/proccmptest"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// The test binary is also the comparison's worker: Start re-executes it
// with the worker's environment, and TestMain hands over to RunWorker.
func TestMain(m *testing.M) { proccmptest.Main(m, IsWorker, RunWorker) }

// start starts a redis-server and a comparison on it with the Quick
// configuration, both stopped by tb.Cleanup.
func start(tb testing.TB) *Comparison {
	tb.Helper()
	srv := redistest.StartServer(tb)
	return proccmptest.Start(tb, func(argv []string) (*Comparison, error) {
		return Start(srv.Addr(), argv, Quick)
	})
}

// BenchmarkRedisCompare runs every scenario of the comparison (one round
// of the Quick configuration per iteration: with -benchtime 1x, a few
// seconds) and reports each lock's figure of each row as a metric:
// durations in µs, the rest as they are.
//
//	go test -run '^$' -bench RedisCompare -benchtime 1x ./rediscmp
//
// cmd/redis-compare runs more rounds and prints the table.
func BenchmarkRedisCompare(b *testing.B) {
	proccmptest.Benchmark(b, start(b).Comparison)
}

// TestRedisLockIsFIFOAcrossProcesses: the grant-order scenario sees no
// grant out of order for redislock, and the hand-off scenario completes
// for every lock, on a real server with worker processes.
func TestRedisLockIsFIFOAcrossProcesses(t *testing.T) {
	proccmptest.FIFOAcrossProcesses(t, start(t).Comparison)
}

// TestHolderKilled: after the holder's process is killed, each lock's
// waiter is granted within about a TTL and a third (the TTL, and
// redislock's re-read of its queue every third of it), with a margin for
// a loaded machine.
func TestHolderKilled(t *testing.T) {
	proccmptest.HolderKilled(t, start(t).Comparison)
}
