package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// lateLimiter is the limiter of the tests of a late check: a one-minute
// window on the application's clock over store, fail open, with timeout
// (0: none) and no deny cache.
func lateLimiter(t *testing.T, store *limiter.RedisStore, prefix string, timeout time.Duration) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(limiter.Policy{Name: "late", KeyPrefix: prefix, Windows: []limiter.Window{{Duration: time.Minute}},
		AppClock: true, Timeout: timeout, Fail: limiter.FailOpen},
		limiter.Backend{Store: store, Base: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// lateAfterWarm warms store with a check that carries no deadline (its
// connection, the script; nothing that teaches it Redis's clock), then
// returns a lateLimiter of a 100 ms timeout and its fresh key prefix.
func lateAfterWarm(t *testing.T, store *limiter.RedisStore) (*limiter.Limiter, string) {
	t.Helper()
	warm := lateLimiter(t, store, randomID(t)+":", 0)
	if d, err := warm.Decide(context.Background(), &limiter.Input{Identity: "warm", Limits: []int64{10}}); err != nil || d.Err != nil {
		t.Fatal(err, d.Err)
	}
	prefix := randomID(t) + ":"
	return lateLimiter(t, store, prefix, 100*time.Millisecond), prefix
}

// failOpenDuringStall sends K's check while srv is paused: fail open must
// admit it, at l's timeout. It returns Redis's count of TIME calls before.
func failOpenDuringStall(t *testing.T, srv *redistest.Server, l *limiter.Limiter, what string) int64 {
	t.Helper()
	times := srv.CommandStats(t)["time"].Calls
	srv.Pause()
	d, err := l.Decide(context.Background(), &limiter.Input{Identity: "K", Limits: []int64{10}})
	srv.Resume()
	if err != nil {
		t.Fatal(err)
	}
	if d.Err == nil || d.Source != limiter.SourceFailOpen || !d.Pass {
		t.Fatalf("%s during a stall: %s from %s (err %v), want admitted by fail open", what, d.Outcome, d.Source, d.Err)
	}
	return times
}

// waitTimeRan waits until Redis has run more TIME calls than times, at
// most 3 s (what was sent during a stall may also have been dropped unread).
func waitTimeRan(t *testing.T, srv *redistest.Server, times int64) {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if srv.CommandStats(t)["time"].Calls > times {
			return
		}
	}
}

// TestFirstCheckIsNeverChargedLate: a RedisStore that has not yet learnt
// how far Redis's clock is from its own sends its very first check while
// Redis is stalled. The caller gives up at its timeout and the fail mode
// answers (fail open: admitted, uncharged); when Redis resumes, nothing it
// runs may charge the key, as for any late check (README: a request the
// fail mode answered is never also charged). Batched and not.
func TestFirstCheckIsNeverChargedLate(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, batched := range []bool{false, true} {
		name := "unbatched"
		var opts []limiter.RedisOption
		if batched {
			name, opts = "batched", []limiter.RedisOption{limiter.WithBatching(2, 16)}
		}
		// As the module builds its client: a call gives up at its
		// context's deadline, and is not tried again.
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true,
			ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
		t.Cleanup(func() { _ = client.Close() })
		store := limiter.NewRedisStore(client, opts...)
		t.Cleanup(func() { store.Close() })
		// The store has called Redis (its connection exists, it knows how
		// to call the script, Redis has the script), but only with checks
		// that carry no deadline and the application's clock: nothing has
		// taught it Redis's clock yet (as a new limiter's first calls,
		// which read the overrides' index, do not).
		l, prefix := lateAfterWarm(t, store)

		// Whatever was written to Redis during the stall runs now: the
		// old check (which reads TIME) or a TIME call. Wait until Redis
		// has run it (at most 3 s: it may also have been dropped unread).
		times := failOpenDuringStall(t, srv, l, name+": the first check")
		waitTimeRan(t, srv, times)
		if keys := srv.CLI(t, "--scan", "--pattern", prefix+"*"); keys != "" {
			t.Errorf("%s: after the stall, Redis holds %q: the check the fail mode answered was charged when Redis resumed", name, keys)
		}
	}
}

// noTimeClient is a client whose Redis refuses TIME to it (NOPERM), as a
// Redis 6 ACL without +time does, while its scripts may read TIME.
type noTimeClient struct{ *redis.Client }

type permErr string

func (e permErr) Error() string { return string(e) }
func (permErr) RedisError()     {}

func (c noTimeClient) Process(ctx context.Context, cmd redis.Cmder) error {
	if cmd.Name() == "time" {
		err := permErr("NOPERM User limiter has no permissions to run the 'time' command")
		cmd.SetErr(err)
		return err
	}
	return c.Client.Process(ctx, cmd)
}

// TestChecksGoWhereTimeIsRefused: where Redis answers but refuses TIME to
// the limiter's user, the store cannot learn its clock offset that way; its
// checks still go (their replies teach the offset), and are decided by
// Redis, not by the fail mode.
func TestChecksGoWhereTimeIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store := limiter.NewRedisStore(noTimeClient{client})
	t.Cleanup(func() { store.Close() })
	l, err := limiter.New(limiter.Policy{Name: "notime", KeyPrefix: randomID(t) + ":", Windows: []limiter.Window{{Duration: time.Minute}},
		AppClock: true, Timeout: 2 * time.Second, Fail: limiter.FailOpen},
		limiter.Backend{Store: store, Base: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	for i := 1; i <= 3; i++ {
		d, err := l.Decide(context.Background(), &limiter.Input{Identity: "K", Limits: []int64{10}})
		if err != nil || d.Err != nil || d.Source != limiter.SourceRedis || d.Windows[0].Count != int64(i) {
			t.Fatalf("request %d: %s from %s (count %d, err %v %v), want admitted by Redis with count %d", i, d.Outcome, d.Source,
				d.Windows[0].Count, err, d.Err, i)
		}
	}
}

// TestLateTimeReplyTeachesNoOffset: a store whose client reads past a
// call's context deadline (no ContextTimeoutEnabled, a long ReadTimeout)
// sends a check before it knows Redis's clock, during a stall: its TIME
// call outlives the check, which the fail mode answers, and its reply comes
// when Redis resumes, a whole stall after it was sent. That round trip
// teaches no offset: had it (the offset as lenient as the stall was long),
// the next check, sent into the next stall, would carry a deadline that
// late on Redis's clock and run when Redis resumes, charged though its
// caller applied the fail mode (the Redis simulation's fresh seed
// 1796551104107665449: a lease taken). Batched, as the simulation's nodes:
// unbatched, such a client keeps the caller waiting until its ReadTimeout,
// past the check's deadline on Redis's clock however lenient.
func TestLateTimeReplyTeachesNoOffset(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	store := limiter.NewRedisStore(client, limiter.WithBatching(2, 16))
	t.Cleanup(func() { store.Close() })
	// As in TestFirstCheckIsNeverChargedLate: the store has called Redis,
	// with checks that carry no deadline (nothing has taught it Redis's
	// clock).
	l, prefix := lateAfterWarm(t, store)
	for i := range 2 {
		// What was written during the stall runs now (the TIME call, or
		// the check): wait until Redis has run it and the client has read
		// its reply.
		times := failOpenDuringStall(t, srv, l, fmt.Sprintf("check %d", i+1))
		if i == 0 {
			waitTimeRan(t, srv, times)
		}
		time.Sleep(100 * time.Millisecond)
		if keys := srv.CLI(t, "--scan", "--pattern", prefix+"*"); keys != "" {
			t.Fatalf("after stall %d, Redis holds %q: a check the fail mode answered was charged when Redis resumed", i+1, keys)
		}
	}
}
