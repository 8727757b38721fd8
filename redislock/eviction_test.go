package redislock_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// TestEvictingPolicyRefused: on a server whose maxmemory-policy can
// evict the lock's keys (every policy but noeviction: allkeys-* evicts
// any key, volatile-* the keys with a TTL, the session markers among
// them), memory pressure from other keys can remove a marker or an entry
// and grant a key twice. New refuses such a server with an error naming
// the policy and noeviction, on one node and on a Cluster with one such
// master; it accepts noeviction.
func TestEvictingPolicyRefused(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.StartServerWith(t, redistest.Options{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", policy}})
			l, err := redislock.New(srv.NewClient(t), "evict", redislock.WithTTL(testTTL))
			if err == nil {
				l.Close(context.Background())
				t.Fatalf("New on a server with maxmemory-policy %s: no error", policy)
			}
			t.Logf("New: %v", err)
			if !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), "noeviction") {
				t.Errorf("New's error %q does not name the policy %s and noeviction", err, policy)
			}
			if _, err := redislock.NewSemaphore(srv.NewClient(t), "evict-sem", 2); err == nil {
				t.Errorf("NewSemaphore on a server with maxmemory-policy %s: no error", policy)
			}
		})
	}
	t.Run("noeviction", func(t *testing.T) {
		srv := redistest.StartServerWith(t, redistest.Options{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"}})
		l := newLocker(t, srv.NewClient(t), "evict")
		lockUnlock(t, l, "k", 1)
	})
	t.Run("cluster", func(t *testing.T) {
		nodes := redistest.StartNodes(t, 2)
		admin := redis.NewClient(&redis.Options{Addr: nodes.Nodes[1].Addr()})
		defer admin.Close()
		if err := admin.ConfigSet(context.Background(), "maxmemory-policy", "volatile-lru").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := redislock.New(nodes.NewClient(t), "evict", redislock.WithTTL(testTTL))
		if err == nil || !strings.Contains(err.Error(), "volatile-lru") || !strings.Contains(err.Error(), nodes.Nodes[1].Addr()) {
			t.Errorf("New on a Cluster with one master on volatile-lru: %v; want an error naming the policy and the node", err)
		}
	})
}

// TestEvictionPolicyUnreadable: where CONFIG is not allowed (an ACL user
// without it, as managed services often give, or the command renamed
// away in the server's configuration), New cannot read the policy: it
// works, and each Locker warns once through its logger that the policy
// must be noeviction.
func TestEvictionPolicyUnreadable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"ACL", func(t *testing.T) *redis.Client {
			srv := redistest.StartServer(t)
			if err := srv.NewClient(t).Do(ctx, "ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all", "-config").Err(); err != nil {
				t.Fatal(err)
			}
			return newClient(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "secret"})
		}},
		{"renamed", func(t *testing.T) *redis.Client {
			return redistest.StartServerWith(t, redistest.Options{Args: []string{"--rename-command", "CONFIG", ""}}).NewClient(t)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			if err := c.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil {
				t.Fatal("CONFIG GET allowed")
			}
			w := &syncWriter{}
			logger := slog.New(slog.NewTextHandler(w, nil))
			l := newLocker(t, c, "unreadable", redislock.WithLogger(logger))
			lockUnlock(t, l, "k", 3)
			l2 := newLocker(t, c, "unreadable", redislock.WithLogger(logger))
			lockUnlock(t, l2, "k", 1)
			logs := strings.TrimSpace(w.String())
			t.Logf("log:\n%s", logs)
			lines := strings.Split(logs, "\n")
			if len(lines) != 2 {
				t.Fatalf("%d log lines from two Lockers; want one warning each", len(lines))
			}
			for _, ln := range lines {
				if !strings.Contains(ln, "level=WARN") || !strings.Contains(ln, "maxmemory-policy") || !strings.Contains(ln, "noeviction") {
					t.Errorf("log line %q: want a warning that the maxmemory-policy must be noeviction", ln)
				}
			}
		})
	}
}

// syncWriter is a buffer that log records may be written to from any
// goroutine while the test reads it.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
