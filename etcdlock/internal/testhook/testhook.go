// Package testhook gives etcdlock's tests what they need from inside a
// Locker. The tests run in a module of their own
// (etcdlock/internal/etcdlocktests), so that the etcd server they start
// stays out of etcdlock's go.mod and so out of its users' module graphs;
// a test file there cannot reach etcdlock's unexported fields, as an
// export_test.go beside the package could. Package etcdlock sets the
// hooks when it is initialised. That module is never published and is
// only built in the workspace, from the same commit as etcdlock, so its
// import of this internal package cannot meet another etcdlock release.
package testhook

// PauseWatch ends the watch of l (an *etcdlock.Locker or
// *etcdlock.Semaphore) on its prefix, as
// a compaction or a lost leader would, and holds off the next one until
// resume is called: the deletions made meanwhile reach l only through the
// listing it rebuilds its subscriptions from. It returns once the watch
// is down.
var PauseWatch func(l any) (resume func())

// Unsettled returns how many of l's calls on key (l an *etcdlock.Locker
// or *etcdlock.Semaphore) still have to read their queue before a release
// can reach them through the watch alone: queued calls whose subscription
// is not that of their last read. A benchmark of a release waits for
// none, so that it times the release, not the end of the enqueues.
var Unsettled func(l any, key string) int
