package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartPingSetGet(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if s.Port == 6379 || !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
		t.Fatalf("unexpected address %q", s.Addr())
	}
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	if got := s.CLI(t, "GET", "k"); got != "v" {
		t.Fatalf("redis-cli GET = %q; want \"v\"", got)
	}
}

func TestExtraArgs(t *testing.T) {
	t.Parallel()
	s := Start(t, "--maxmemory", "10mb")
	if got := s.CLI(t, "CONFIG", "GET", "maxmemory"); !strings.HasSuffix(got, "10485760") {
		t.Fatalf("CONFIG GET maxmemory = %q", got)
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	s.Kill() // idempotent

	port, addr := s.Port, s.Addr()
	s.Restart()
	if s.Port != port || s.Addr() != addr {
		t.Fatalf("Restart moved the server: %s -> %s", addr, s.Addr())
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	// No persistence: the restarted server is empty.
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after Restart: err = %v; want redis.Nil", err)
	}

	s.Restart() // restarting a running server works too
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("Addrs = %v", c.Addrs())
	}
	for _, s := range c.Servers {
		if info := s.CLI(t, "CLUSTER", "INFO"); !strings.Contains(info, "cluster_state:ok") {
			t.Fatalf("%s CLUSTER INFO:\n%s", s.Addr(), info)
		}
	}

	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	for i := range 30 {
		key := fmt.Sprintf("{tag%d}:k", i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
		}
	}
	// 30 different hash tags spread over 3 masters: every master holds some.
	for _, s := range c.Servers {
		if n, err := s.Client(t).DBSize(ctx).Result(); err != nil || n == 0 {
			t.Fatalf("%s DBSIZE = %d, %v; want keys on every master", s.Addr(), n, err)
		}
	}
}

func TestStartTLS(t *testing.T) {
	t.Parallel()
	certs := NewCerts(t)
	s := StartTLS(t, certs)
	ctx := context.Background()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	if got := s.CLI(t, "PING"); got != "PONG" {
		t.Fatalf("redis-cli --tls PING = %q", got)
	}
	// Plain TCP gets no PONG from a TLS-only server.
	if err := ping(s.Addr(), nil); err == nil {
		t.Fatal("plain-text PING answered by a TLS-only server")
	}
	s.Restart()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS after Restart: %v", err)
	}
}

func TestStartSentinel(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t, 1)
	if got := s.MasterAddr(t); got != s.Master.Addr() {
		t.Fatalf("Sentinel's master %s, want %s", got, s.Master.Addr())
	}
	if info := s.Replica.CLI(t, "INFO", "replication"); !strings.Contains(info, "role:slave") {
		t.Fatalf("replica INFO replication:\n%s", info)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	s.Pause()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a paused server answered PING")
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
	s.Pause() // cleanup kills a paused server
}
