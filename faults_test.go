package slidingratelimit

// The fault suite: real redis-server processes, faults injected
// while requests flow through provisioned handlers, and for each fault:
//
//   - every request is answered within the Redis timeout (+ a margin for
//     scheduling), whatever Redis does;
//   - while the fault lasts, every request follows the configured fail mode
//     (open: 200 source=fail_open; closed: 503 source=fail_closed; local:
//     decided by the in-process store, source=local, limits enforced per
//     instance);
//   - no panic and no error from ServeHTTP;
//   - once the fault is healed, decisions come from Redis again
//     (source=redis) without re-provisioning, within the breaker's
//     cool-down bound.
//
// TestFaultGoroutineLeak runs a compact version of every case and checks,
// with goleak, that no goroutine they started is left.
//
// The cases are not parallel: they measure every request's latency, and the
// leak test looks at the process's goroutines. Together they take about 20s
// under -race.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/goleak"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

const (
	// faultTimeout is the Redis timeout of every handler in the suite.
	faultTimeout = 100 * time.Millisecond
	// faultMargin is the scheduling slack allowed on top of the timeout
	// (the suite runs under -race on small CI machines).
	faultMargin = 100 * time.Millisecond
	// faultRecovery bounds the time from healing a fault to decisions from
	// Redis: the breaker's longest cool-down (5s) plus a probe.
	faultRecovery = 6 * time.Second
	// faultStreak is how long a handler must be answered by Redis alone to
	// count as recovered.
	faultStreak = 300 * time.Millisecond
	// Load: faultWorkers goroutines per handler, each sending a request every
	// faultGap at most, and at most faultMaxPerWorker requests.
	faultWorkers      = 2
	faultGap          = 2 * time.Millisecond
	faultMaxPerWorker = 20000
	// faultKey is the key template of the suite's handlers.
	faultKey = "{http.request.header.X-API-Key}"
)

// faultTiming sizes a case: the full suite holds each fault for a second,
// the goroutine-leak test runs compact versions.
type faultTiming struct {
	warm time.Duration // load before the fault
	hold time.Duration // how long the fault lasts
}

var (
	fullTiming    = faultTiming{warm: 300 * time.Millisecond, hold: time.Second}
	compactTiming = faultTiming{warm: 100 * time.Millisecond, hold: 400 * time.Millisecond}
)

// TestFaultKillRestart: Redis killed under load, then restarted on the same
// port (its script cache empty). Fail open, closed and local.
func TestFaultKillRestart(t *testing.T) { faultKillRestart(t, fullTiming) }

// TestFaultScriptFlush: SCRIPT FLUSH in a loop while requests hammer one key:
// EVALSHA falls back to EVAL, nothing fails, and exactly the limit is
// admitted, for every algorithm.
func TestFaultScriptFlush(t *testing.T) { faultScriptFlush(t, 150, 3, 100) }

// TestFaultClientPause: CLIENT PAUSE WRITE, then CLIENT PAUSE ALL: Redis
// holds the scripts, requests time out into the fail mode.
func TestFaultClientPause(t *testing.T) { faultClientPause(t, fullTiming) }

// TestFaultProxyStall: a TCP proxy between the limiter and Redis stops
// delivering bytes (it holds them) and later releases them.
func TestFaultProxyStall(t *testing.T) { faultProxyStall(t, fullTiming) }

// TestFaultDebugSleep: DEBUG SLEEP blocks Redis' only thread.
func TestFaultDebugSleep(t *testing.T) { faultDebugSleep(t, fullTiming) }

// TestFaultMaxmemory: Redis at maxmemory with noeviction answers OOM to the
// scripts' writes; raising maxmemory heals it.
func TestFaultMaxmemory(t *testing.T) { faultMaxmemory(t, fullTiming) }

// TestFaultReadonlyReplica: the limiter pointed at a replica gets READONLY
// for every script; REPLICAOF NO ONE promotes it and heals it.
func TestFaultReadonlyReplica(t *testing.T) { faultReadonlyReplica(t, fullTiming) }

// TestFaultGoroutineLeak runs a compact version of every fault case (each
// provisions handlers, causes its fault and cleans up: h.Cleanup releases
// the shared stores, the servers are killed) and then checks, with goleak,
// that no goroutine started since is left. Not parallel: it looks at the
// whole process's goroutines.
func TestFaultGoroutineLeak(t *testing.T) {
	existing := goleak.IgnoreCurrent()
	t.Run("kill_restart", func(t *testing.T) { faultKillRestart(t, compactTiming) })
	t.Run("script_flush", func(t *testing.T) { faultScriptFlush(t, 20, 2, 20) })
	t.Run("client_pause", func(t *testing.T) { faultClientPause(t, compactTiming) })
	t.Run("proxy_stall", func(t *testing.T) { faultProxyStall(t, compactTiming) })
	t.Run("debug_sleep", func(t *testing.T) { faultDebugSleep(t, compactTiming) })
	t.Run("maxmemory", func(t *testing.T) { faultMaxmemory(t, compactTiming) })
	t.Run("readonly_replica", func(t *testing.T) { faultReadonlyReplica(t, compactTiming) })
	t.Run("clients_closed", faultClientsClosed)

	// A goroutine started since and still there after a settle of up to
	// 5s is a leak (goleak's own retries settle for under half a second,
	// short on a loaded machine).
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err = goleak.Find(existing); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("goroutines started by the faults are left five seconds after their cleanup: %v", err)
	}
}

// faultClientsClosed: idle go-redis connections hold no goroutine, so a
// client left open would not show in the goroutine count. Two handlers share
// one client; the first Cleanup keeps it, the last closes it: Redis sees its
// connections go, and the store leaves the pool.
func faultClientsClosed(t *testing.T) {
	srv := redistest.Start(t)
	targets := faultTargets(t, srv.Addr(), "sliding_log", "5", "open", "local")
	l := startFaultLoad(t, targets, 0)
	time.Sleep(100 * time.Millisecond)
	l.halt()
	key := targets[0].h.rt.storeKey
	if n, ok := stores.References(key); !ok || n != 2 {
		t.Fatalf("store references with two handlers: %d (loaded %v), want 2", n, ok)
	}
	clients := func() int64 { return srv.InfoInt(t, "clients", "connected_clients") - 1 } // less redis-cli
	if n := clients(); n < 1 {
		t.Fatalf("%d limiter connections under load, want some", n)
	}
	if err := targets[0].h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n := clients(); n < 1 {
		t.Fatalf("one handler's Cleanup closed the client its sibling still uses (%d connections left)", n)
	}
	if w := serveFault(targets[1].h, "after-first-cleanup", time.Now()); w.source != faultRedis || w.code != http.StatusOK {
		t.Fatalf("the remaining handler after its sibling's Cleanup: status %d source %q", w.code, w.source)
	}
	if err := targets[1].h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n, ok := stores.References(key); ok {
		t.Errorf("store still in the pool after the last Cleanup (%d references)", n)
	}
	deadline := time.Now().Add(2 * time.Second)
	for clients() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := clients(); n > 0 {
		t.Errorf("%d limiter connections still open at Redis after the last Cleanup", n)
	}
}

func faultKillRestart(t *testing.T, tm faultTiming) {
	srv := redistest.Start(t)
	targets := faultTargets(t, srv.Addr(), "sliding_log", "5", "open", "closed", "local")
	l := startFaultLoad(t, targets, 0)
	l.warmUp(tm.warm)

	begin := l.now()
	srv.Kill()
	from := l.now()
	// fail local enforces the limit per instance while Redis is down.
	faultBurst(t, targets[2].h, "burst-down", 5, sourceLocal)
	l.sleepUntil(from + tm.hold)
	to := l.now()
	srv.Restart()
	l.waitRecovered(to)
	l.halt()
	l.check(t, faultWindow{fault: "kill", begin: begin, from: from, to: to})

	// Decisions come from Redis again: exactly the limit, recorded there
	// (one entry per request; the key says its format by its marker).
	faultBurst(t, targets[2].h, "burst-up", 5, faultRedis)
	if n := logEntries(t, srv, targets[2].h.rt.lim.Keys().Key("log", "burst-up", false, ""), 0); n != 5 {
		t.Errorf("after recovery: %d requests recorded in Redis for the burst key, want 5 (decided by Redis)", n)
	}
}

// flushTimeout is faultScriptFlush's Redis timeout: the test is of the
// EVAL fallback, not of timeouts, and on a loaded machine a check past the
// suite's 100ms answered fail closed (503), which it counts as a failure.
const flushTimeout = 2 * time.Second

func faultScriptFlush(t *testing.T, limit, workers, perWorker int) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	type run struct {
		name string
		h    *Handler
	}
	var runs []run
	for _, alg := range []string{"sliding_log", "sliding_counter", "fixed_window", "token_bucket"} {
		// clock app with a frozen clock: no refill or window turn during the
		// run, so every algorithm must admit exactly the limit. It stands at
		// a minute's start: a fixed window's key lives until its window ends
		// + 1 s on Redis's clock, which runs on (newTestClock's 11:59:59 gave
		// it 2 s, and a loaded machine's run outlived it: 189 admitted of 150).
		clk := newTestClock()
		clk.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
		h := &Handler{Name: uniqueName(), Algorithm: alg, Key: faultKey, Limit: Amount(strconv.Itoa(limit)),
			Window: caddy.Duration(time.Minute), Fail: "closed", DenyCacheSize: -1,
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(flushTimeout)}}
		provision(t, h, clk)
		runs = append(runs, run{alg + "/clock_app", h})
	}
	// The function library does not mind SCRIPT FLUSH; by EVALSHA each
	// flush makes calls fall back to EVAL.
	for _, scripts := range []string{"functions", "eval"} {
		h := &Handler{Name: uniqueName(), Key: faultKey, Limit: Amount(strconv.Itoa(limit)),
			Window: caddy.Duration(time.Minute), Fail: "closed", DenyCacheSize: -1,
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(flushTimeout), Scripts: scripts}}
		provision(t, h, nil)
		runs = append(runs, run{"sliding_log/clock_redis/" + scripts, h})
	}

	ctx := context.Background()
	stop := make(chan struct{})
	var flushes atomic.Int64
	var flushErr atomic.Pointer[error]
	var fwg sync.WaitGroup
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				flushErr.Store(&err)
				return
			}
			flushes.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()

	t0 := time.Now()
	stalls := startStallMeter(t0)
	samples := make([][]faultSample, len(runs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, r := range runs {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perWorker {
					s := serveFault(r.h, "hot", t0)
					mu.Lock()
					samples[i] = append(samples[i], s)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	stalls.halt()
	close(stop)
	fwg.Wait()
	if p := flushErr.Load(); p != nil {
		t.Fatalf("SCRIPT FLUSH: %v", *p)
	}

	for i, r := range runs {
		var allowed, denied int
		var worst time.Duration
		for _, s := range samples[i] {
			worst = max(worst, s.took())
			switch {
			case s.panic != "":
				t.Fatalf("%s: %s", r.name, s.panic)
			case s.err != nil:
				t.Errorf("%s: ServeHTTP: %v", r.name, s.err)
			case s.source != "redis":
				t.Errorf("%s: a request was decided by %q (status %d), want redis: SCRIPT FLUSH must not fail a request",
					r.name, s.source, s.code)
			case s.code == http.StatusOK:
				allowed++
			case s.code == http.StatusTooManyRequests:
				denied++
			default:
				t.Errorf("%s: status %d", r.name, s.code)
			}
			if over, st := stalls.overTimeoutOf(s, flushTimeout); over {
				t.Errorf("%s: a request took %v (%v of it in the process's own stalls)", r.name, s.took(), st)
			}
		}
		if allowed != limit {
			t.Errorf("%s: %d admitted under SCRIPT FLUSH, want exactly the limit %d", r.name, allowed, limit)
		}
		t.Logf("%s: %d requests, %d admitted, %d denied, all by redis; max latency %v",
			r.name, len(samples[i]), allowed, denied, worst)
	}
	stats := srv.CommandStats(t)
	evals := stats["eval"].Calls
	t.Logf("%d SCRIPT FLUSH during the run; %d EVAL fallbacks, %d EVALSHA", flushes.Load(), evals, stats["evalsha"].Calls)
	if flushes.Load() == 0 || evals == 0 {
		t.Errorf("the run did not exercise the EVAL fallback: %d flushes, %d EVAL", flushes.Load(), evals)
	}
}

func faultClientPause(t *testing.T, tm faultTiming) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	targets := faultTargets(t, srv.Addr(), "sliding_log", "5", "open", "closed")
	for _, mode := range []string{"WRITE", "ALL"} {
		l := startFaultLoad(t, targets, 0)
		l.warmUp(tm.warm)
		begin := l.now()
		if err := c.Do(context.Background(), "CLIENT", "PAUSE", tm.hold.Milliseconds(), mode).Err(); err != nil {
			t.Fatalf("CLIENT PAUSE %s: %v", mode, err)
		}
		// Redis started the pause after begin, so it lasts at least until
		// begin+hold: every request between the reply and then is held.
		from, to := l.now(), begin+tm.hold
		l.sleepUntil(to)
		l.waitRecovered(to)
		l.halt()
		l.check(t, faultWindow{fault: "CLIENT PAUSE " + mode, begin: begin, from: from, to: to})
	}
}

func faultProxyStall(t *testing.T, tm faultTiming) {
	srv := redistest.Start(t)
	p := newStallProxy(t, srv.Addr())
	targets := faultTargets(t, p.Addr(), "sliding_log", "5", "closed", "local")
	// A client of its own with one connection: its requests also wait for
	// the pooled connection, and that wait is bounded by the timeout too.
	targets = append(targets, faultTargetsWith(t, RedisConfig{Addresses: []string{p.Addr()}, PoolSize: 1}, "sliding_log", "5", "open")...)
	l := startFaultLoad(t, targets, 0)
	l.warmUp(tm.warm)
	begin := l.now()
	p.Stall(true)
	from := l.now()
	faultBurst(t, targets[1].h, "burst-stalled", 5, sourceLocal)
	l.sleepUntil(from + tm.hold)
	to := l.now()
	p.Stall(false)
	l.waitRecovered(to)
	l.halt()
	l.check(t, faultWindow{fault: "proxy stall", begin: begin, from: from, to: to})
	t.Logf("proxy: %d connections accepted", p.accepted.Load())
}

func faultDebugSleep(t *testing.T, tm faultTiming) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	c := srv.Client(t)
	targets := faultTargets(t, srv.Addr(), "sliding_log", "5", "open", "closed")
	l := startFaultLoad(t, targets, 0)
	l.warmUp(tm.warm)
	begin := l.now()
	secs := strconv.FormatFloat(tm.hold.Seconds(), 'f', 3, 64)
	if err := c.Do(context.Background(), "DEBUG", "SLEEP", secs).Err(); err != nil {
		t.Fatalf("DEBUG SLEEP %s: %v", secs, err)
	}
	end := l.now()
	// Redis slept for hold from a moment between begin and end-hold: it was
	// asleep all through [end-hold, begin+hold].
	from, to := end-tm.hold, begin+tm.hold
	l.waitRecovered(end)
	l.halt()
	l.check(t, faultWindow{fault: "DEBUG SLEEP " + secs, begin: begin, from: from, to: to})
}

func faultMaxmemory(t *testing.T, tm faultTiming) {
	// (4mb: the function library, about 160 KB of used_memory_functions,
	// and the load's clients' buffers take Redis to about 2 MB before the
	// first key; at 2mb, a library grown by the counter's fast path put it
	// over maxmemory before the fault began.)
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	c := srv.Client(t)
	ctx := context.Background()
	// sliding_counter keeps O(1) state per key, and the load cycles through
	// a few keys under a huge limit: every request writes, none is denied,
	// and the limiter alone never fills the 2mb.
	targets := faultTargets(t, srv.Addr(), "sliding_counter", "1000000000", "open", "closed")
	l := startFaultLoad(t, targets, 16)
	l.warmUp(tm.warm)

	begin := l.now()
	junk := strings.Repeat("x", 16<<10)
	oom := false
	for i := 0; i < 4096 && !oom; i++ {
		err := c.Set(ctx, "junk:"+strconv.Itoa(i), junk, 0).Err()
		switch {
		case err == nil:
		case strings.HasPrefix(err.Error(), "OOM"):
			oom = true
		default:
			t.Fatalf("filling Redis: %v", err)
		}
	}
	if !oom {
		t.Fatal("Redis never answered OOM while filling it")
	}
	// The last junk key put Redis over maxmemory by at most 16 KB, less
	// than client buffers that Redis may free by itself later: move
	// maxmemory 512 KB below the memory in use, so Redis stays over it.
	used := srv.InfoInt(t, "memory", "used_memory")
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-512<<10, 10)).Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write after filling Redis: %v, want an OOM error", err)
	}
	from := l.now()
	l.sleepUntil(from + tm.hold)
	to := l.now()
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory 0: %v", err)
	}
	l.waitRecovered(to)
	l.halt()
	l.check(t, faultWindow{fault: "maxmemory", begin: begin, from: from, to: to})
	faultLogged(t, targets, "OOM")
}

func faultReadonlyReplica(t *testing.T, tm faultTiming) {
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(replica.CLI(t, "INFO", "replication"), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatalf("replica never linked to its primary:\n%s", replica.CLI(t, "INFO", "replication"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	targets := faultTargets(t, replica.Addr(), "sliding_log", "5", "open", "closed", "local")
	l := startFaultLoad(t, targets, 0)
	// The fault is there from the first request.
	faultBurst(t, targets[2].h, "burst-readonly", 5, sourceLocal)
	l.sleepUntil(tm.hold)
	to := l.now()
	if got := replica.CLI(t, "REPLICAOF", "NO", "ONE"); got != "OK" {
		t.Fatalf("REPLICAOF NO ONE: %q", got)
	}
	l.waitRecovered(to)
	l.halt()
	l.check(t, faultWindow{fault: "READONLY replica", begin: 0, from: 0, to: to})
	faultLogged(t, targets, "READONLY")
	faultBurst(t, targets[2].h, "burst-promoted", 5, faultRedis)
}
