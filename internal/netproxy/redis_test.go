package netproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// newRedisClient is a go-redis client through p set up as the plugin sets
// up its own: deadlines from the context, no retries.
func newRedisClient(t *testing.T, p *Proxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: p.Addr(), DialTimeout: time.Second, ContextTimeoutEnabled: true,
		MaxRetries: -1, DisableIdentity: true, Protocol: 2,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ping(c *redis.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// TestRedisThroughProxy: a real redis-server 20ms away each way answers
// PING in at least 40ms and a pipeline of 1000 commands in about one round
// trip; during a Cut a PING fails with context.DeadlineExceeded (not a
// refusal, not EOF), on an old connection and on a new one; after Heal it
// works again. go-redis closes a connection whose read timed out, so the
// PING dropped by the cut leaves no hole in any stream: the next PING dials
// a new connection. A connection idle during the cut is used again as is.
func TestRedisThroughProxy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p := newProxy(t, srv.Addr())
	p.SetDelay(20*time.Millisecond, 20*time.Millisecond)
	rdb, idle := newRedisClient(t, p), newRedisClient(t, p)
	for _, c := range []*redis.Client{rdb, idle} {
		if err := ping(c, 5*time.Second); err != nil { // dials
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := ping(rdb, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 40*time.Millisecond {
		t.Fatalf("PING 20ms away each way took %v, want at least 40ms", rtt)
	}
	pipelined(t, rdb)

	p.Cut()
	err := ping(rdb, 300*time.Millisecond)
	assertTimedOut(t, "PING on an open connection during a cut", err)
	during := newRedisClient(t, p)
	assertTimedOut(t, "PING on a connection opened during the cut", ping(during, 300*time.Millisecond))

	p.Heal()
	accepted := p.Stats().Accepted
	if err := ping(idle, 5*time.Second); err != nil {
		t.Fatalf("PING after Heal on a connection idle during the cut: %v", err)
	}
	if got := p.Stats().Accepted; got != accepted {
		t.Fatalf("the idle client dialled again after Heal (accepted %d -> %d), want its connection reused", accepted, got)
	}
	if err := ping(rdb, 5*time.Second); err != nil {
		t.Fatalf("PING after Heal: %v", err)
	}
	if got := p.Stats().Accepted; got != accepted+1 {
		t.Fatalf("accepted %d -> %d after the timed-out client's PING, want one new connection (go-redis dropped the old one)", accepted, got)
	}
}

// pipelined sends 1000 INCRs in one pipeline: with the requests in flight
// together it takes about one round trip, far from 1000 (40s).
func pipelined(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	cmds, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for range 1000 {
			pipe.Incr(ctx, "netproxy:pipelined")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := cmds[len(cmds)-1].(*redis.IntCmd).Val(); n != 1000 {
		t.Fatalf("last INCR = %d, want 1000", n)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("1000 pipelined INCRs 40ms away took %v, want them in flight together (under 2s)", d)
	}
}

// assertTimedOut fails unless err is the context's deadline, the way a
// black hole fails: not a refused connection, not EOF, not a reset. With
// ContextTimeoutEnabled go-redis sets the socket's deadline to the
// context's, so what it returns is the socket's "i/o timeout" (a *net.OpError
// wrapping os.ErrDeadlineExceeded, Timeout() true), not
// context.DeadlineExceeded itself; either is accepted.
func assertTimedOut(t *testing.T, what string, err error) {
	t.Helper()
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v, want a timeout, not a closed connection", what, err)
	}
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: %v (%T), want the context's deadline exceeded", what, err, err)
	}
}
