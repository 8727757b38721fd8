package etcdlock

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"
)

// New's first round trip against a cluster it cannot reach. The etcd
// client dials in the background and retries a request that finds no
// connection until the request's context ends, so an unreachable cluster
// would cost New its whole bound and return only "context deadline
// exceeded". grantFirst races the lease's grant with a plain TCP dial of
// every endpoint, and when none of them can be dialled it gives up at
// once with the dials' errors (connection refused, no route to host, a
// dial timeout), which is what a caller needs to fix it.

// probeTimeout bounds each endpoint's dial in grantFirst.
const probeTimeout = 3 * time.Second

// grantFirst grants the Locker's first lease, or fails with the cause
// when no endpoint can be dialled.
func grantFirst(ctx context.Context, lk *leaseKeeper, endpoints []string) error {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	granted := make(chan error, 1)
	go func() { granted <- lk.grant(gctx) }()
	unreachable := make(chan error, 1)
	go func() { unreachable <- dialAll(gctx, endpoints) }()
	select {
	case err := <-granted:
		return err
	case err := <-unreachable:
		if err == nil {
			return <-granted // an endpoint answers: the grant decides
		}
		cancel()
		if gerr := <-granted; gerr == nil {
			return nil // granted all the same, just in time
		}
		return err
	}
}

// dialAll dials every endpoint over TCP, at once, each bounded by
// probeTimeout, and returns nil as soon as one connects (or for
// endpoints it cannot dial this way: unix sockets), else the dials'
// errors joined.
func dialAll(ctx context.Context, endpoints []string) error {
	if len(endpoints) == 0 {
		return nil
	}
	errs := make(chan error, len(endpoints))
	for _, ep := range endpoints {
		go func() {
			host, ok := hostPort(ep)
			if !ok {
				errs <- nil
				return
			}
			dctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			var d net.Dialer
			c, err := d.DialContext(dctx, "tcp", host)
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	var all []error
	for range endpoints {
		err := <-errs
		if err == nil {
			return nil
		}
		all = append(all, err)
	}
	return errors.Join(all...)
}

// hostPort returns the host:port of an etcd endpoint ("host:port",
// "http://host:port", "https://host:port"); false for one it cannot dial
// over TCP (a unix socket).
func hostPort(ep string) (string, bool) {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return "", false
		}
		return u.Host, u.Host != ""
	}
	return ep, !strings.HasPrefix(ep, "unix")
}
