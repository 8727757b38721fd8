package backend

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"
)

// Reachable dials every endpoint over TCP, at once, each bounded by
// timeout, and returns nil as soon as one connects (or at once for an
// endpoint it cannot dial that way: a unix socket), else the dials'
// errors joined (connection refused, no route to host, a dial timeout).
// An endpoint is "host:port" or a URL ("http://host:port",
// "https://host:port", "postgres://host:port/db"). A backend's New races
// it with its first round trip: an engine client that dials in the
// background and retries a request until the request's context ends (the
// etcd client) would otherwise make New wait for its whole bound and
// report only "context deadline exceeded", where the dial's error is what
// a caller needs to fix it.
func Reachable(ctx context.Context, endpoints []string, timeout time.Duration) error {
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
			dctx, cancel := context.WithTimeout(ctx, timeout)
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

// hostPort returns the host:port of an endpoint; false for one it cannot
// dial over TCP (a unix socket, a URL without a host).
func hostPort(ep string) (string, bool) {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || u.Scheme == "unix" || u.Scheme == "unixs" {
			return "", false
		}
		return u.Host, u.Host != "" && strings.Contains(u.Host, ":")
	}
	return ep, !strings.HasPrefix(ep, "unix")
}
