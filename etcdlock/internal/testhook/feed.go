package testhook

// PauseFeeds ends the watches of the feeds (Follow) of l (an
// *etcdlock.Locker or *etcdlock.Semaphore), as a broken connection would,
// and holds off their next ones until resume is called: each feed then
// watches again from the revision after the last it applied, or, if etcd
// compacted it meanwhile, reads the key afresh and reports a gap. It
// returns once n feeds of l wait to watch again.
var PauseFeeds func(l any, n int) (resume func())
