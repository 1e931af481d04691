package limiter_test

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// cachedEntry is the type of the global lua.DecideCached keeps its entry
// in, on c's Redis: "function" when the body is built, "nil" when not.
func cachedEntry(t *testing.T, c *redis.Client) string {
	t.Helper()
	v, err := c.Eval(context.Background(), `return type(rawget(_G, ARGV[1]))`, nil, lua.Library).Text()
	if err != nil {
		t.Fatalf("reading the global %s: %v", lua.Library, err)
	}
	return v
}

// cachedLoaded reports whether Redis holds lua.DecideCached.
func cachedLoaded(t *testing.T, c *redis.Client) bool {
	t.Helper()
	ok, err := c.ScriptExists(context.Background(), limiter.CachedScriptSHA).Result()
	if err != nil {
		t.Fatalf("SCRIPT EXISTS: %v", err)
	}
	return ok[0]
}

// TestRedis6Paths: on Redis 6 a store learns from INFO that there are no
// functions and calls lua.DecideCached by EVALSHA (one EVAL, at the first
// NOSCRIPT), whose first call builds the body and keeps its entry in the
// global named lua.Library; one told to use EVALSHA (ScriptsEval) calls the
// scripts that define everything on each call and keeps nothing. Both
// decide the same, unbatched and batched.
func TestRedis6Paths(t *testing.T) {
	t.Parallel()
	for _, p := range []struct {
		name   string
		cached bool
		opts   []limiter.RedisOption
	}{
		{"auto", true, nil},
		{"auto batched", true, []limiter.RedisOption{limiter.WithBatching(2, 8)}},
		{"EVALSHA", false, []limiter.RedisOption{limiter.WithScripts(limiter.ScriptsEval)}},
		{"EVALSHA batched", false, []limiter.RedisOption{limiter.WithScripts(limiter.ScriptsEval), limiter.WithBatching(2, 8)}},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartRedis6(t)
			c := srv.Client(t)
			s := limiter.NewRedisStore(c, p.opts...)
			t.Cleanup(func() { s.Close() })
			countThenPeek(t, s, "paths6:{a}")
			cs := srv.CommandStats(t)
			if cs["fcall"].Calls+cs["function"].Calls != 0 {
				t.Errorf("FCALL or FUNCTION sent to Redis 6: %+v", cs)
			}
			if p.cached && (cs["eval"].Calls != 1 || cs["evalsha"].Calls != 5) {
				t.Errorf("eval %d, evalsha %d; want 1 EVAL (at the first NOSCRIPT) and 5 EVALSHA", cs["eval"].Calls, cs["evalsha"].Calls)
			}
			entry := "nil"
			if p.cached {
				entry = "function"
			}
			if got := cachedEntry(t, c); got != entry || cachedLoaded(t, c) != p.cached {
				t.Errorf("the global %s holds a %s, lua.DecideCached loaded %v; want a %s, %v", lua.Library, got, cachedLoaded(t, c), entry, p.cached)
			}
		})
	}
}

// TestRedis6UnknownFCALL: a store whose user may not run INFO (so it tries
// FCALL first) turns to lua.DecideCached when Redis 6 answers that it does
// not know FCALL; no check fails on the way.
func TestRedis6UnknownFCALL(t *testing.T) {
	t.Parallel()
	srv := redistest.StartRedis6(t)
	srv.CLI(t, "ACL", "SETUSER", "lim", "on", ">pw", "~*", "+@all", "-info")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "lim", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	if err := c.Info(context.Background(), "server").Err(); err == nil {
		t.Fatal("the user may run INFO: the test would not reach FCALL")
	}
	s := limiter.NewRedisStore(c)
	t.Cleanup(func() { s.Close() })
	for i := range 3 {
		mustCount(t, s, "unknown6:{a}", int64(i+1), "check")
	}
	cs := srv.CommandStats(t)
	if cs["evalsha"].Calls != 3 || cs["eval"].Calls != 1 {
		t.Errorf("evalsha %d, eval %d; want 3 and 1 (FCALL once, unknown, then lua.DecideCached)", cs["evalsha"].Calls, cs["eval"].Calls)
	}
	if got := cachedEntry(t, srv.Client(t)); got != "function" {
		t.Errorf("the global %s holds a %s, want the cached entry", lua.Library, got)
	}
}

// TestRedis6ScriptFlush: SCRIPT FLUSH on Redis 6 drops the Lua state and
// the entry lua.DecideCached kept in it; the next call meets NOSCRIPT,
// sends EVAL, builds the body again, and every algorithm's count goes on
// exactly where it was (its state is in the keys, not in the Lua state).
func TestRedis6ScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.StartRedis6(t)
	c := srv.Client(t)
	s := limiter.NewRedisStore(c)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC).UnixMicro()
	kinds := []limiter.Kind{limiter.KindLog, limiter.KindCounter, limiter.KindFixed, limiter.KindToken}
	for i := range 4 {
		for _, k := range kinds {
			op := &limiter.Op{Cost: 1, Now: now, Parts: []limiter.Part{{Key: "flush6:{" + k.String() + "}", Kind: k,
				Windows: []limiter.Win{{Name: limiter.WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 3}}}}}
			r, err := s.Do(ctx, op)
			if err != nil {
				t.Fatalf("%v check %d: %v", k, i+1, err)
			}
			want := limiter.StatusAllowed
			if i == 3 {
				want = limiter.StatusDenied // the limit is 3, whatever flushed the scripts between
			}
			if r.Status != want || r.Usage[0].Count != int64(min(i+1, 3)) {
				t.Fatalf("%v check %d after SCRIPT FLUSH: %+v, want status %v, count %d", k, i+1, r, want, min(i+1, 3))
			}
		}
		if got := cachedEntry(t, c); got != "function" {
			t.Fatalf("after round %d the global %s holds a %s, want the entry", i+1, lua.Library, got)
		}
		srv.CLI(t, "SCRIPT", "FLUSH")
		if got := cachedEntry(t, c); got != "nil" {
			t.Fatalf("after SCRIPT FLUSH the global %s holds a %s, want none", lua.Library, got)
		}
	}
}

// TestRedis6WarmOrCold: a check's answer does not depend on whether the
// body lua.DecideCached keeps was built by an earlier call: the
// differential test's histories (every algorithm, bans, leases,
// overrides, several windows, callers' clocks apart) on two Redis 6
// servers, one whose scripts are flushed before every call (each call
// builds the body anew) and one never flushed (each call after the first
// runs on what earlier calls left), give the in-process store's replies,
// to the microsecond.
func TestRedis6WarmOrCold(t *testing.T) {
	t.Parallel()
	warm := redistest.StartRedis6(t).Client(t)
	coldSrv := redistest.StartRedis6(t)
	cold := coldSrv.Client(t)
	const n = 300
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			mem := limiter.NewMemoryStore()
			t.Cleanup(func() { mem.Close() })
			names := []string{"memory", "Redis 6 warm", "Redis 6 cold"}
			stores := []limiter.Store{mem, limiter.NewRedisStore(warm), limiter.NewRedisStore(cold)}
			kb, _ := limiter.NewKeyBuilder("warm6:", "d")
			rng := rand.New(rand.NewPCG(uint64(alg)+7, 0x6))
			g := &diffGen{rng: rng, kb: kb, kind: kindOf(alg), run: randomID(t), now: time.Date(2026, 12, 3, 12, 10, 0, 0, time.UTC).UnixMicro()}
			ctx := context.Background()
			for i := 0; i < n; i++ {
				g.keepAhead()
				if a := g.override(); a != nil {
					applyOverride(t, ctx, a, g.now, stores, names)
				}
				op, what := g.op()
				var replies []limiter.Reply
				for j, s := range stores {
					if j == 2 {
						// (A test of its own per algorithm: another's flush
						// may come between this and the call; either way
						// the call finds the body unbuilt or built.)
						if err := cold.ScriptFlush(ctx).Err(); err != nil {
							t.Fatal(err)
						}
					}
					r, err := s.Do(ctx, cloneOp(op))
					if err != nil {
						t.Fatalf("op %d %s on %s: %v", i, what, names[j], err)
					}
					replies = append(replies, r)
				}
				for j := 1; j < len(replies); j++ {
					if !reflect.DeepEqual(replies[j], replies[0]) {
						t.Fatalf("op %d %s:\n  %-12s %+v\n  %-12s %+v", i, what, names[0], replies[0], names[j], replies[j])
					}
				}
			}
			if got := coldSrv.CommandStats(t)["eval"].Calls; got < n {
				t.Errorf("%d EVALs on the flushed server, want at least %d (one a check)", got, n)
			}
		})
	}
}
