package etcdlock_test

// The examples of etcdlock/example_test.go, run: there they compile
// only, since etcdlock's module has no etcd server (RELEASING.md).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A program dials its etcd cluster with clientv3.New and builds a Locker
// on the client, under a key prefix of its own. The endpoints (and, for a
// cluster that requires client certificates, the TLS files) come from the
// program's configuration; here, from the environment.
// TestExampleSetup runs this code against an embedded server.
func Example_setup() {
	// The cluster's client URLs, e.g. "https://etcd-1:2379,https://etcd-2:2379".
	cfg := clientv3.Config{
		Endpoints:   strings.Split(os.Getenv("ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second,
	}
	// TLS is optional: a cluster run with --client-cert-auth wants the
	// client's certificate, and https endpoints the cluster's CA.
	if ca := os.Getenv("ETCD_CA_FILE"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			log.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		cert, err := tls.LoadX509KeyPair(os.Getenv("ETCD_CERT_FILE"), os.Getenv("ETCD_KEY_FILE"))
		if err != nil {
			log.Fatal(err)
		}
		cfg.TLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	locks, err := etcdlock.New(client, "/locks/orders")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	g, err := locks.Lock(ctx, "order-7")
	if err != nil {
		log.Fatal(err)
	}
	// … work on order-7, fencing writes with g.IsOwner or g.Token …
	if err := g.Unlock(ctx); err != nil {
		log.Fatal(err) // etcdlock.ErrLost: the grant ended before Unlock
	}
}

// TestExampleSetup runs Example_setup, which has no Output line (it needs
// a cluster), against an embedded etcd server.
func TestExampleSetup(t *testing.T) {
	srv := etcdtest.StartServer(t)
	t.Setenv("ETCD_ENDPOINTS", strings.Join(srv.Endpoints(), ","))
	t.Setenv("ETCD_CA_FILE", "")
	Example_setup()
}

// Writes to etcd made under a grant are fenced with IsOwner: they happen
// only if the grant is still current when etcd applies them. IsOwner is
// a method of *etcdlock.Guard, the type behind every keylock.Lease that
// etcdlock returns. The example
// runs its own etcd server, embedded in the process with package etcdtest
// (for tests and examples only); a program dials its cluster instead, as
// Example_setup shows.
func Example() {
	dir, err := os.MkdirTemp("", "etcdlock-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := etcdtest.NewServer(dir) // an embedded etcd on free loopback ports
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	locks, err := etcdlock.New(client, "/locks/orders")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	lease, err := locks.Lock(ctx, "order-7")
	if err != nil {
		log.Fatal(err)
	}
	// Lock returns a keylock.Lease, so that code written against package
	// keylock runs on etcd too; behind it is always a *etcdlock.Guard,
	// whose IsOwner is one type assertion away.
	g := lease.(*etcdlock.Guard)
	resp, err := client.Txn(ctx).
		If(g.IsOwner()).
		Then(clientv3.OpPut("/orders/order-7", "paid")).
		Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("written under the grant:", resp.Succeeded)
	if err := g.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	// The same transaction with the released grant writes nothing.
	resp, err = client.Txn(ctx).If(g.IsOwner()).Then(clientv3.OpPut("/orders/order-7", "stale")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("written after Unlock:", resp.Succeeded)
	// Output:
	// written under the grant: true
	// written after Unlock: false
}

// fencedStore is a store outside etcd that refuses writes from grants
// older than the newest it has accepted (Kleppmann's fencing tokens).
type fencedStore struct {
	mu     sync.Mutex
	tokens map[string]uint64 // largest token accepted per key
	data   map[string]string
}

var errStale = errors.New("stale fencing token")

func (s *fencedStore) Put(key, value string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.tokens[key] {
		return errStale
	}
	s.tokens[key] = token
	s.data[key] = value
	return nil
}

// A store outside etcd keeps the largest token it has seen for a key and
// refuses smaller ones: a holder that lost its grant (paused past its
// lease, say) cannot overwrite what a later holder wrote.
//
// The example runs an embedded etcd server (package etcdtest), as Example
// does.
func Example_guardToken() {
	dir, err := os.MkdirTemp("", "etcdlock-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := etcdtest.NewServer(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	locks, err := etcdlock.New(client, "/locks/files")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)
	store := &fencedStore{tokens: map[string]uint64{}, data: map[string]string{}}

	first, err := locks.Lock(ctx, "report.pdf")
	if err != nil {
		log.Fatal(err)
	}
	// Suppose the first holder stalls and loses its grant; here it simply
	// unlocks, and a second holder takes the key.
	_ = first.Unlock(ctx)
	second, err := locks.Lock(ctx, "report.pdf")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("second holder:", store.Put("report.pdf", "v2", second.Token()))
	fmt.Println("first holder, late:", store.Put("report.pdf", "v1", first.Token()))
	_ = second.Unlock(ctx)
	// Output:
	// second holder: <nil>
	// first holder, late: stale fencing token
}
