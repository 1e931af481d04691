package limiter_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// scriptPaths are the ways a store can call the script on Redis 7, each
// unbatched and batched.
var scriptPaths = []struct {
	name  string
	funcs bool
	opts  []limiter.RedisOption
}{
	{"FCALL", true, nil},
	{"FCALL batched", true, []limiter.RedisOption{limiter.WithBatching(2, 8)}},
	{"EVALSHA", false, []limiter.RedisOption{limiter.WithScripts(limiter.ScriptsEval)}},
	{"EVALSHA batched", false, []limiter.RedisOption{limiter.WithScripts(limiter.ScriptsEval), limiter.WithBatching(2, 8)}},
}

// pathOp is a check (or, peek, a peek) of one sliding log of limit 1000 a
// minute on key.
func pathOp(key string, peek bool) *limiter.Op {
	op := &limiter.Op{Cost: 1, Parts: []limiter.Part{{Key: key, Kind: limiter.KindLog,
		Windows: []limiter.Win{{Name: limiter.WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 1000}}}}}
	if peek {
		op.Mode = limiter.ModePeek
	}
	return op
}

// mustCount runs a check on key and requires it admitted with count want.
// countThenPeek makes three checks of key on s (counts 1 to 3), a peek
// that records nothing (count 3) and a fourth check (count 4).
func countThenPeek(t *testing.T, s limiter.Store, key string) {
	t.Helper()
	for i := range 3 {
		mustCount(t, s, key, int64(i+1), "check")
	}
	r, err := s.Do(context.Background(), pathOp(key, true))
	if err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 3 {
		t.Fatalf("peek: %+v %v, want allowed, count 3 (nothing recorded)", r, err)
	}
	mustCount(t, s, key, 4, "check after the peek")
}

func mustCount(t *testing.T, s limiter.Store, key string, want int64, what string) {
	t.Helper()
	r, err := s.Do(context.Background(), pathOp(key, false))
	if err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != want {
		t.Fatalf("%s: %+v %v, want admitted with count %d", what, r, err, want)
	}
}

// libraries is FUNCTION LIST's library names on srv.
func libraries(t *testing.T, c *redis.Client) []string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatalf("FUNCTION LIST: %v", err)
	}
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// TestScriptPaths: on Redis 7 a store calls the function library, FCALL
// for checks and FCALL_RO for peeks, having loaded it once (FUNCTION LIST
// shows it under its versioned name); one told to use EVALSHA never loads
// a function. Each path decides the same.
func TestScriptPaths(t *testing.T) {
	t.Parallel()
	if !strings.HasPrefix(lua.Library, "sliding_ratelimit_") || len(lua.Library) != len("sliding_ratelimit_")+8 {
		t.Fatalf("library name %q, want sliding_ratelimit_<8 hex digits>", lua.Library)
	}
	for _, p := range scriptPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			c := srv.Client(t)
			s := limiter.NewRedisStore(c, p.opts...)
			t.Cleanup(func() { s.Close() })
			countThenPeek(t, s, "paths:{a}")
			cs := srv.CommandStats(t)
			fcall, ro, loads := cs["fcall"], cs["fcall_ro"].Calls, cs["function|load"].Calls
			evals := cs.Sum("evalsha", "eval").Calls
			libs := libraries(t, c)
			if p.funcs {
				// The first FCALL finds no function and loads the library.
				if fcall.Calls != 5 || fcall.FailedCalls != 1 || ro != 1 || loads != 1 || evals != 0 || len(libs) != 1 || libs[0] != lua.Library {
					t.Errorf("fcall %d (%d failed), fcall_ro %d, function load %d, evalsha/eval %d, libraries %v; want 5 (1), 1, 1, 0, [%s]",
						fcall.Calls, fcall.FailedCalls, ro, loads, evals, libs, lua.Library)
				}
			} else if fcall.Calls+ro+loads != 0 || cs["evalsha"].Calls != 5 || len(libs) != 0 {
				t.Errorf("fcall %d, fcall_ro %d, function load %d, evalsha %d, libraries %v; want no function, 5 EVALSHA",
					fcall.Calls, ro, loads, cs["evalsha"].Calls, libs)
			}
		})
	}
}

// TestScriptsSurviveFlushes: SCRIPT FLUSH, FUNCTION FLUSH and FLUSHALL
// (which keeps functions, and drops the keys) fail no request on any path: the library or the script is loaded again
// and the call sent again. A function library does not mind SCRIPT FLUSH
// (no load), and FUNCTION FLUSH costs one load however many calls find the
// function gone.
func TestScriptsSurviveFlushes(t *testing.T) {
	t.Parallel()
	for _, p := range scriptPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := limiter.NewRedisStore(srv.Client(t), p.opts...)
			t.Cleanup(func() { s.Close() })
			loads := func() int64 { return srv.CommandStats(t)["function|load"].Calls }
			mustCount(t, s, "flush:{a}", 1, "first check")
			srv.CLI(t, "SCRIPT", "FLUSH")
			mustCount(t, s, "flush:{a}", 2, "after SCRIPT FLUSH")
			before := loads()
			srv.CLI(t, "FUNCTION", "FLUSH")
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					if _, err := s.Do(context.Background(), pathOp("flush:{b}", false)); err != nil {
						t.Errorf("concurrent check %d after FUNCTION FLUSH: %v", i, err)
					}
				})
			}
			wg.Wait()
			mustCount(t, s, "flush:{a}", 3, "after FUNCTION FLUSH")
			if got := loads() - before; p.funcs && got != 1 || !p.funcs && got != 0 {
				t.Errorf("%d FUNCTION LOADs after FUNCTION FLUSH, want %d", got, map[bool]int{true: 1}[p.funcs])
			}
			srv.CLI(t, "FLUSHALL")
			mustCount(t, s, "flush:{a}", 1, "after FLUSHALL (the key is gone)")
			srv.CLI(t, "FUNCTION", "FLUSH")
			srv.CLI(t, "SCRIPT", "FLUSH")
			mustCount(t, s, "flush:{a}", 2, "after both flushes")
		})
	}
}

// outcome is one check of a load run: when it was sent and how it ended.
type outcome struct {
	sent time.Time
	err  error
}

// loadRun sends checks to s one after another, each given 300 ms, until
// stop is closed, and returns every outcome.
func loadRun(s limiter.Store, key string, stop <-chan struct{}) <-chan []outcome {
	done := make(chan []outcome, 1)
	go func() {
		var out []outcome
		for {
			select {
			case <-stop:
				done <- out
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			sent := time.Now()
			_, err := s.Do(ctx, pathOp(key, false))
			cancel()
			out = append(out, outcome{sent, err})
			if err != nil {
				time.Sleep(20 * time.Millisecond) // Redis is down: no busy loop
			}
		}
	}()
	return done
}

// checkOutage requires every failed check of outs to be an outage (what
// the fail mode answers: Redis unreachable, or out of time) sent between
// down (or within a check's 300 ms before it: in flight) and up, and some
// check after up to have passed. It returns the number of failures.
func checkOutage(t *testing.T, outs []outcome, down, up time.Time) int {
	t.Helper()
	failed, after := 0, 0
	for _, o := range outs {
		if o.err == nil {
			if o.sent.After(up) {
				after++
			}
			continue
		}
		failed++
		kind := limiter.KindOf(o.err)
		if kind != limiter.ErrKindConnection && kind != limiter.ErrKindTimeout {
			t.Errorf("a check failed with %v (kind %q): not an outage the fail mode answers", o.err, kind)
		}
		if o.sent.Before(down.Add(-300*time.Millisecond)) || o.sent.After(up) {
			t.Errorf("a check sent %v after Redis came back (or before it went) failed: %v", o.sent.Sub(up), o.err)
		}
	}
	if after == 0 {
		t.Errorf("no check passed after Redis came back (%d checks, %d failed)", len(outs), failed)
	}
	return failed
}

// TestScriptsSurviveRestart: a Redis restarted empty (no persistence: no
// keys, no functions, no scripts) fails only the checks sent while it is
// down, and with an outage; the first call after it loads the library (or
// the script) again, on every path.
func TestScriptsSurviveRestart(t *testing.T) {
	t.Parallel()
	for _, p := range scriptPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := limiter.NewRedisStore(srv.Client(t), p.opts...)
			t.Cleanup(func() { s.Close() })
			mustCount(t, s, "restart:{a}", 1, "before the restart")
			stop := make(chan struct{})
			outs := loadRun(s, "restart:{b}", stop)
			time.Sleep(100 * time.Millisecond)
			down := time.Now()
			srv.Restart()
			up := time.Now()
			time.Sleep(200 * time.Millisecond)
			close(stop)
			failed := checkOutage(t, <-outs, down, up)
			mustCount(t, s, "restart:{a}", 1, "after the restart (the key is gone)")
			if libs := libraries(t, srv.Client(t)); p.funcs && (len(libs) != 1 || libs[0] != lua.Library) {
				t.Errorf("libraries after the restart: %v, want [%s]", libs, lua.Library)
			}
			t.Logf("%d checks failed while Redis restarted (%v)", failed, up.Sub(down).Round(time.Millisecond))
		})
	}
}

// TestScriptsSurviveFailover: the library replicates with the data, so
// after Sentinel promotes the replica the store calls it there without
// loading it again, and only checks sent during the failover fail, with
// an outage.
func TestScriptsSurviveFailover(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t, 1)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: sn.Addrs(),
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	s := limiter.NewRedisStore(c, limiter.WithBatching(2, 8))
	t.Cleanup(func() { s.Close() })
	mustCount(t, s, "failover:{a}", 1, "before the failover")
	replica := sn.Replica.Client(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if libs := libraries(t, replica); len(libs) == 1 && libs[0] == lua.Library {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the replica's libraries: %v, want [%s] (replicated)", libs, lua.Library)
		}
	}
	replicated := sn.Replica.CommandStats(t)["function|load"].Calls
	stop := make(chan struct{})
	outs := loadRun(s, "failover:{b}", stop)
	time.Sleep(100 * time.Millisecond)
	down := time.Now()
	sn.Master.Kill()
	var up time.Time
	for deadline := time.Now().Add(20 * time.Second); up.IsZero(); time.Sleep(50 * time.Millisecond) {
		if role, _ := replica.Do(context.Background(), "ROLE").Slice(); len(role) > 0 && role[0] == "master" {
			up = time.Now()
		} else if time.Now().After(deadline) {
			t.Fatalf("the replica was not promoted within 20 s")
		}
	}
	// The client finds the new master at Sentinel's switch; until then a
	// check may still fail, so up is when one passes again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := s.Do(context.Background(), pathOp("failover:{c}", false)); err == nil {
			up = time.Now()
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no check passed 10 s after the promotion: %v", err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	failed := checkOutage(t, <-outs, down, up)
	mustCount(t, s, "failover:{a}", 2, "after the failover (the key replicated)")
	cs := sn.Replica.CommandStats(t)
	if loads := cs["function|load"].Calls - replicated; loads != 0 || cs["fcall"].FailedCalls != 0 || cs["fcall"].Calls == 0 {
		t.Errorf("the promoted replica: %d FUNCTION LOADs, %d FCALLs (%d failed); want 0 loads (the library replicated), no failed FCALL",
			loads, cs["fcall"].Calls, cs["fcall"].FailedCalls)
	}
	t.Logf("%d checks failed during the failover (%v)", failed, up.Sub(down).Round(time.Millisecond))
}

// TestScriptsFallBackToEvalsha: a client whose ACL user may not run INFO,
// FCALL or FUNCTION (as the README's ACL line had it before functions)
// still decides, by EVALSHA, from its first check on; so does one whose
// user may run FCALL but not FUNCTION LOAD.
func TestScriptsFallBackToEvalsha(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range []struct{ user, acl string }{
		{"nofunctions", "-info -fcall -fcall_ro -function"},
		{"noload", "-function|load"},
	} {
		srv.CLI(t, append([]string{"ACL", "SETUSER", c.user, "on", ">pw", "~*", "&*", "+@all"}, strings.Fields(c.acl)...)...)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: c.user, Password: "pw"})
		t.Cleanup(func() { client.Close() })
		for _, opts := range [][]limiter.RedisOption{nil, {limiter.WithBatching(2, 8)}} {
			s := limiter.NewRedisStore(client, opts...)
			key := "fallback:{" + randomID(t) + "}"
			before := srv.CommandStats(t)["evalsha"].Calls
			for i := range 3 {
				mustCount(t, s, key, int64(i+1), c.user+": check")
			}
			if n := srv.CommandStats(t)["evalsha"].Calls - before; n < 3 {
				t.Errorf("%s: %d EVALSHAs for 3 checks, want 3 or more", c.user, n)
			}
			s.Close()
		}
	}
	if libs := libraries(t, srv.Client(t)); len(libs) != 0 {
		t.Errorf("libraries %v, want none (no user could load one)", libs)
	}
	if cachedLoaded(t, srv.Client(t)) {
		t.Error("lua.DecideCached loaded on Redis 7 (a refused FCALL is not an unknown one): want the scripts of ScriptsEval")
	}
}

// TestScriptsUnknownFCALLOnRedis7: where INFO says Redis 7 but FCALL is
// unknown (a proxy that lacks it; here the command renamed away), the store
// goes by the scripts of ScriptsEval, not by lua.DecideCached, which there
// (a read-only _G) would build the whole body on every call.
func TestScriptsUnknownFCALLOnRedis7(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--rename-command", "FCALL", "", "--rename-command", "FCALL_RO", "")
	for _, opts := range [][]limiter.RedisOption{nil, {limiter.WithBatching(2, 8)}} {
		s := limiter.NewRedisStore(srv.Client(t), opts...)
		key := "renamed:{" + randomID(t) + "}"
		before := srv.CommandStats(t)["evalsha"].Calls
		for i := range 3 {
			mustCount(t, s, key, int64(i+1), "check")
		}
		if n := srv.CommandStats(t)["evalsha"].Calls - before; n < 3 {
			t.Errorf("%d EVALSHAs for 3 checks, want 3 or more", n)
		}
		s.Close()
	}
	if cachedLoaded(t, srv.Client(t)) {
		t.Error("lua.DecideCached loaded on a Redis 7 without FCALL: want the scripts of ScriptsEval")
	}
}

// TestLogChecksGoByTheLogScript: on the EVALSHA path a call whose checks
// are all of one kind's fast form (mode 0, one part of one window, nothing
// else) goes by that kind's fast script (lua.DecideFast), one whose checks
// are all sliding_log's without a ban by the script that holds only the
// log (lua.DecideLog), and any other by the full script; each answers as
// the full one does, after SCRIPT FLUSH too (NOSCRIPT sends its own
// source).
func TestLogChecksGoByTheLogScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	// loaded says which of the fast log script, the log's and the full one
	// are cached.
	loaded := func() (fast, log, full bool) {
		v, err := c.ScriptExists(ctx, redis.NewScript(lua.DecideFast[1]).Hash(), redis.NewScript(lua.DecideLog).Hash(),
			redis.NewScript(lua.Decide).Hash()).Result()
		if err != nil {
			t.Fatalf("SCRIPT EXISTS: %v", err)
		}
		return v[0], v[1], v[2]
	}
	for _, opts := range [][]limiter.RedisOption{{limiter.WithScripts(limiter.ScriptsEval)},
		{limiter.WithScripts(limiter.ScriptsEval), limiter.WithBatching(2, 8)}} {
		c.ScriptFlush(ctx)
		s := limiter.NewRedisStore(srv.Client(t), opts...)
		key := "logscript:{" + randomID(t) + "}"
		for i := range 3 {
			mustCount(t, s, key, int64(i+1), "log check")
		}
		if fast, log, full := loaded(); !fast || log || full {
			t.Errorf("after log checks: fast script loaded %v, log script %v, full script %v; want only the fast one", fast, log, full)
		}
		if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute+time.Minute/8+time.Second {
			t.Errorf("the log's TTL is %v, want the window + an eighth + 1 s at most, and set", ttl)
		}
		// With a lease and an override key: the log's script.
		op := pathOp(key, false)
		op.Lease = &limiter.LeaseOp{Key: key + ":lease", Max: 5, Timeout: time.Minute.Microseconds(), ID: randomID(t)}
		op.Override = &limiter.OverrideRef{Key: key + ":ov"}
		if r, err := s.Do(ctx, op); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 4 || r.InFlight != 1 {
			t.Fatalf("log check with a lease: %+v %v, want admitted, count 4, 1 in flight", r, err)
		}
		if _, log, full := loaded(); !log || full {
			t.Errorf("after a log check with a lease: log script loaded %v, full script %v; want the log's alone", log, full)
		}
		c.ScriptFlush(ctx)
		mustCount(t, s, key, 5, "log check after SCRIPT FLUSH")
		// A counter with a lease goes by the full script (in the common
		// form, by its own fast script: TestFastScripts).
		ctr := pathOp(key+":ctr", false)
		ctr.Parts[0].Kind = limiter.KindCounter
		ctr.Lease = &limiter.LeaseOp{Key: key + ":ctr:lease", Max: 5, Timeout: time.Minute.Microseconds(), ID: randomID(t)}
		if r, err := s.Do(ctx, ctr); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 1 {
			t.Fatalf("counter check: %+v %v", r, err)
		}
		if _, _, full := loaded(); !full {
			t.Errorf("after a counter check the full script is not loaded")
		}
		s.Close()
	}
}

// TestFastScripts: on the EVALSHA path the checks of fixed_window and
// token_bucket in the fast form go by their kind's fast script
// (lua.DecideFast), which answers as the full script does: on the fast path
// and when it hands a check to the body it holds (a token bucket whose
// state a reload of the limit left under another interval, a key holding
// another window's fields), in a call of one check or of several, with a
// key of the wrong type failing its own check alone.
func TestFastScripts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, kind := range []limiter.Kind{limiter.KindFixed, limiter.KindToken, limiter.KindCounter} {
		sha := redis.NewScript(lua.DecideFast[int(kind)]).Hash()
		for _, opts := range [][]limiter.RedisOption{{limiter.WithScripts(limiter.ScriptsEval)},
			{limiter.WithScripts(limiter.ScriptsEval), limiter.WithBatching(4, 8)}} {
			c.ScriptFlush(ctx)
			s := limiter.NewRedisStore(srv.Client(t), opts...)
			key := "fastscript:{" + randomID(t) + "}"
			op := func(limit int64) *limiter.Op {
				o := pathOp(key, false)
				o.Parts[0].Kind, o.Parts[0].Windows[0].Limit = kind, limit
				o.Now = 1_000_000_000_000
				return o
			}
			for i := range 3 {
				if r, err := s.Do(ctx, op(10)); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != int64(i+1) {
					t.Fatalf("%v check %d: %+v %v, want admitted with count %d", kind, i+1, r, err, i+1)
				}
			}
			if v := c.ScriptExists(ctx, sha, redis.NewScript(lua.Decide).Hash()).Val(); !v[0] || v[1] {
				t.Errorf("%v: fast script loaded %v, full script %v; want the fast one alone", kind, v[0], v[1])
			}
			// A reload halves the limit: the token bucket's state is under
			// another interval, which decide rescales (its units in use
			// stay); the fixed window's count stays.
			if r, err := s.Do(ctx, op(5)); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 4 {
				t.Fatalf("%v after a reload: %+v %v, want admitted with count 4", kind, r, err)
			}
			if r, err := s.Do(ctx, op(5)); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 5 {
				t.Fatalf("%v after the reload: %+v %v, want admitted with count 5", kind, r, err)
			}
			if r, err := s.Do(ctx, op(5)); err != nil || r.Status != limiter.StatusDenied || r.Usage[0].Count != 5 {
				t.Fatalf("%v at the new limit: %+v %v, want denied with count 5", kind, r, err)
			}
			// Another window's fields in the key: decide carries them over.
			other := key + ":other"
			c.HSet(ctx, other, "1000000w", "0", "1000000n", "3", "1000000t", "1000018000000", "1000000i", "6000000", "1000000b", "10")
			o := op(10)
			o.Parts[0].Key = other
			if r, err := s.Do(ctx, o); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count < 1 {
				t.Fatalf("%v with another window's fields: %+v %v, want admitted", kind, r, err)
			}
			// A key of the wrong type fails its own check.
			bad := key + ":bad"
			c.Set(ctx, bad, "x", 0)
			o = op(10)
			o.Parts[0].Key = bad
			if _, err := s.Do(ctx, o); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Errorf("%v on a string key: %v, want WRONGTYPE", kind, err)
			}
			if v := c.ScriptExists(ctx, redis.NewScript(lua.Decide).Hash()).Val(); v[0] {
				t.Errorf("%v: the full script is loaded; want the fast script's body to have decided", kind)
			}
			s.Close()
		}
		// One call of three checks, the second on the string key (its
		// error is its reply), the third on a hash of older fields
		// (fixed_window's fast path reads its own; the others hand it to
		// the body).
		shape := `[0,1,1,0,0,0,` + strconv.Itoa(int(kind)) + `,1,0,"60000000",60000000,10,0]`
		key := "fastscript:{" + randomID(t) + "}"
		c.Set(ctx, key+":bad", "x", 0)
		c.HSet(ctx, key+":old", "60000000t", "1000018000000", "60000000i", "3000000", "60000000b", "10",
			"60000000w", "16666", "60000000n", "3")
		out, err := c.EvalSha(ctx, sha, []string{key, key + ":bad", key + ":old"}, 3, 0, 0, // no deadline, nows whole: bases 0
			shape, "1000000000000", "0", shape, "1000000000000", "0", shape, "1000000000000", "0").Slice()
		if err == nil && (len(out) == 0 || out[len(out)-1] != int64(0)) {
			t.Fatalf("%v: a call of three checks on the caller's clock without deadlines: %v, want the call's time 0 last", kind, out)
		}
		if err == nil {
			// Every fast path appends its reply flat (decide.lua's OUT and
			// fast_reply): 8 × 4 + status, then its other values; decide's
			// is an array. The call's reading of TIME (0: none) ends the
			// reply.
			out = out[:len(out)-1]
			var checks []any
			for i := 0; i < len(out); i++ {
				if x, ok := out[i].(int64); ok && i+int(x/8) <= len(out) {
					n := int(x / 8)
					checks = append(checks, append([]any{x % 8}, out[i+1:i+n]...))
					i += n - 1
					continue
				}
				checks = append(checks, out[i])
			}
			out = checks
		}
		if err != nil || len(out) != 3 {
			t.Fatalf("%v: a call of three checks: %v %v", kind, out, err)
		}
		if r, ok := out[0].([]any); !ok || len(r) != 4 || r[0] != int64(1) || r[1] != int64(1) {
			t.Errorf("%v: the first check's reply %v, want admitted with count 1", kind, out[0])
		}
		if e, ok := out[1].(error); !ok || !strings.Contains(e.Error(), "WRONGTYPE") {
			t.Errorf("%v: the second check's reply %v, want WRONGTYPE", kind, out[1])
		}
		if r, ok := out[2].([]any); !ok || len(r) != 4 || r[0] != int64(1) {
			t.Errorf("%v: the third check's reply %v, want admitted", kind, out[2])
		}
	}
}
