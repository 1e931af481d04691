package slidingratelimit

// The fault suite (issue 8): real redis-server processes, faults injected
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
// TestFaultGoroutineLeak runs a compact version of every case and checks
// that the process's goroutine count comes back to where it was.
//
// The cases are not parallel: they measure every request's latency, and the
// leak test counts the process's goroutines. Together they take about 20s
// under -race.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
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
// the shared stores, the servers are killed) and then checks that no
// goroutine started since is left, and that the goroutine count is back to
// its value before them. Not parallel: it counts the whole process's
// goroutines. (No goleak: the module takes no new dependencies.)
func TestFaultGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	existing := goroutineStacks()
	t.Run("kill_restart", func(t *testing.T) { faultKillRestart(t, compactTiming) })
	t.Run("script_flush", func(t *testing.T) { faultScriptFlush(t, 20, 2, 20) })
	t.Run("client_pause", func(t *testing.T) { faultClientPause(t, compactTiming) })
	t.Run("proxy_stall", func(t *testing.T) { faultProxyStall(t, compactTiming) })
	t.Run("debug_sleep", func(t *testing.T) { faultDebugSleep(t, compactTiming) })
	t.Run("maxmemory", func(t *testing.T) { faultMaxmemory(t, compactTiming) })
	t.Run("readonly_replica", func(t *testing.T) { faultReadonlyReplica(t, compactTiming) })
	t.Run("clients_closed", faultClientsClosed)

	// Goroutines that existed before (the test runner's, paused parallel
	// tests') may end meanwhile; a goroutine started since and still there
	// after a settle of up to 5s is a leak. The count, with a tolerance of 2,
	// is checked too.
	const tolerance = 2
	var left map[string]string
	n := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = goroutineStacks()
		for id := range existing {
			delete(left, id)
		}
		n = runtime.NumGoroutine()
		if (len(left) == 0 && n <= before+tolerance) || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 || n > before+tolerance {
		var b strings.Builder
		for _, st := range left {
			b.WriteString(st)
			b.WriteString("\n\n")
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("goroutines: %d before the faults, %d five seconds after their cleanup (tolerance %d); %d started by the faults are left:\n%s\nall stacks:\n%s",
			before, n, tolerance, len(left), b.String(), buf)
	}
	t.Logf("goroutines: %d before the faults, %d after; none started by them is left", before, n)
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
	key := targets[0].h.storeKey
	if n, ok := stores.References(key); !ok || n != 2 {
		t.Fatalf("store references with two handlers: %d (loaded %v), want 2", n, ok)
	}
	clients := func() int64 { return infoField(t, srv, "clients", "connected_clients") - 1 } // less redis-cli
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

// goroutineStacks returns the stack of every goroutine but the caller's, by
// goroutine id, from runtime.Stack.
func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for i, st := range strings.Split(string(buf), "\n\n") {
		if i == 0 {
			continue // the caller
		}
		if id, ok := strings.CutPrefix(st, "goroutine "); ok {
			id, _, _ = strings.Cut(id, " ")
			out[id] = st
		}
	}
	return out
}

func faultKillRestart(t *testing.T, tm faultTiming) {
	srv := redistest.Start(t)
	targets := faultTargets(t, srv.Addr(), "sliding_log", "5", "open", "closed", "local")
	l := startFaultLoad(t, targets, 0)
	time.Sleep(tm.warm)

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
	// (one member per request, and the log's two bookkeeping members).
	faultBurst(t, targets[2].h, "burst-up", 5, faultRedis)
	if n := srv.CLI(t, "ZCOUNT", targets[2].h.lim.Keys().Key("log", "burst-up", false, ""), "0", "+inf"); n != "5" {
		t.Errorf("after recovery: %s requests recorded in Redis for the burst key, want 5 (decided by Redis)", n)
	}
}

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
		// run, so every algorithm must admit exactly the limit.
		h := &Handler{Name: uniqueName(), Algorithm: alg, Key: faultKey, Limit: Amount(strconv.Itoa(limit)),
			Window: caddy.Duration(time.Minute), Fail: "closed", DenyCacheSize: -1,
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(faultTimeout)}}
		provision(t, h, newTestClock())
		runs = append(runs, run{alg + "/clock_app", h})
	}
	h := &Handler{Name: uniqueName(), Key: faultKey, Limit: Amount(strconv.Itoa(limit)),
		Window: caddy.Duration(time.Minute), Fail: "closed", DenyCacheSize: -1,
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(faultTimeout)}}
	provision(t, h, nil)
	runs = append(runs, run{"sliding_log/clock_redis", h})

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
			if s.took() > faultTimeout+faultMargin {
				t.Errorf("%s: a request took %v", r.name, s.took())
			}
		}
		if allowed != limit {
			t.Errorf("%s: %d admitted under SCRIPT FLUSH, want exactly the limit %d", r.name, allowed, limit)
		}
		t.Logf("%s: %d requests, %d admitted, %d denied, all by redis; max latency %v",
			r.name, len(samples[i]), allowed, denied, worst)
	}
	evals := commandCalls(t, srv, "eval")
	t.Logf("%d SCRIPT FLUSH during the run; %d EVAL fallbacks, %d EVALSHA", flushes.Load(), evals, commandCalls(t, srv, "evalsha"))
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
		time.Sleep(tm.warm)
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
	time.Sleep(tm.warm)
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
	time.Sleep(tm.warm)
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
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	c := srv.Client(t)
	ctx := context.Background()
	// sliding_counter keeps O(1) state per key, and the load cycles through
	// a few keys under a huge limit: every request writes, none is denied,
	// and the limiter alone never fills the 2mb.
	targets := faultTargets(t, srv.Addr(), "sliding_counter", "1000000000", "open", "closed")
	l := startFaultLoad(t, targets, 16)
	time.Sleep(tm.warm)

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
	used := infoField(t, srv, "memory", "used_memory")
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

// ---------------------------------------------------------------------------
// Load and its analysis.

// faultTarget is one provisioned handler under load.
type faultTarget struct {
	mode string // its fail mode
	h    *Handler
	logs *observer.ObservedLogs
}

// faultTargets provisions one handler per fail mode on the Redis at addr,
// with the suite's timeout, a one-minute window and the key from X-API-Key.
func faultTargets(t *testing.T, addr, alg, limit string, modes ...string) []*faultTarget {
	t.Helper()
	return faultTargetsWith(t, RedisConfig{Addresses: []string{addr}}, alg, limit, modes...)
}

// faultTargetsWith is faultTargets with a Redis configuration (its timeout
// is the suite's).
func faultTargetsWith(t *testing.T, cfg RedisConfig, alg, limit string, modes ...string) []*faultTarget {
	t.Helper()
	cfg.Timeout = caddy.Duration(faultTimeout)
	var out []*faultTarget
	for _, m := range modes {
		rc := cfg
		h := &Handler{Name: uniqueName(), Algorithm: alg, Key: faultKey, Limit: Amount(limit),
			Window: caddy.Duration(time.Minute), Fail: m, Redis: &rc}
		logs := provision(t, h, nil)
		out = append(out, &faultTarget{mode: m, h: h, logs: logs})
	}
	return out
}

// faultSample is one request: when it started and ended (since the load
// began), its status, {http.sliding_ratelimit.source} and what went wrong.
type faultSample struct {
	start, end time.Duration
	code       int
	source     string
	body       string
	retryAfter string
	err        error
	panic      string
}

func (s faultSample) took() time.Duration { return s.end - s.start }

// fromRedis reports whether Redis decided the request (a deny-cache answer
// repeats an earlier Redis decision).
func (s faultSample) fromRedis() bool { return s.source == faultRedis || s.source == sourceDenyCache }

// faultRedis is {http.sliding_ratelimit.source} of a decision by Redis.
const faultRedis = "redis"

// serveFault sends one request with X-API-Key: key through h and returns
// what happened, the source placeholder included; a panic is recovered and
// reported in the sample.
func serveFault(h *Handler, key string, t0 time.Time) (s faultSample) {
	w, r, repl := newRequest(map[string]string{"X-API-Key": key})
	s.start = time.Since(t0)
	defer func() {
		s.end = time.Since(t0)
		if p := recover(); p != nil {
			s.panic = fmt.Sprintf("panic in ServeHTTP: %v\n%s", p, debug.Stack())
		}
	}()
	s.err = h.ServeHTTP(w, r, nextOK)
	s.code = w.Code
	if v, ok := repl.Get(phSource); ok {
		s.source, _ = v.(string)
	}
	s.body = w.Body.String()
	s.retryAfter = w.Header().Get("Retry-After")
	return s
}

// faultLoad drives its targets from faultWorkers goroutines each, until
// halt (registered as a cleanup too), and records every request.
type faultLoad struct {
	t0       time.Time
	targets  []*faultTarget
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	haltedAt time.Duration

	mu      sync.Mutex
	samples [][]faultSample // per target
}

var faultLoadSeq atomic.Int64

// startFaultLoad starts the load. keys is the number of distinct keys each
// worker cycles through; 0 gives every request a fresh key, so Redis admits
// each one.
func startFaultLoad(t *testing.T, targets []*faultTarget, keys int) *faultLoad {
	l := &faultLoad{t0: time.Now(), targets: targets, stop: make(chan struct{}), samples: make([][]faultSample, len(targets))}
	id := faultLoadSeq.Add(1)
	for i, tg := range targets {
		for w := range faultWorkers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for n := 0; n < faultMaxPerWorker; n++ {
					select {
					case <-l.stop:
						return
					default:
					}
					k := n
					if keys > 0 {
						k = n % keys
					}
					s := serveFault(tg.h, fmt.Sprintf("L%d-w%d-%d", id, w, k), l.t0)
					l.mu.Lock()
					l.samples[i] = append(l.samples[i], s)
					l.mu.Unlock()
					time.Sleep(faultGap)
				}
			}()
		}
	}
	t.Cleanup(l.halt)
	return l
}

func (l *faultLoad) now() time.Duration { return time.Since(l.t0) }

func (l *faultLoad) sleepUntil(d time.Duration) {
	if w := d - l.now(); w > 0 {
		time.Sleep(w)
	}
}

// halt stops the workers and waits for them.
func (l *faultLoad) halt() {
	l.stopOnce.Do(func() {
		close(l.stop)
		l.wg.Wait()
		l.haltedAt = l.now()
	})
}

// recovery reports, for target i and a fault healed at healed, when it went
// back to Redis for good (the end of its last answer not from Redis, or
// healed), how many Redis answers started since, and whether those have
// lasted faultStreak by now.
func (l *faultLoad) recovery(i int, healed, now time.Duration) (at time.Duration, n int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at = healed
	for _, s := range l.samples[i] {
		if !s.fromRedis() && s.end > at {
			at = s.end
		}
	}
	for _, s := range l.samples[i] {
		if s.fromRedis() && s.start >= at {
			n++
		}
	}
	return at, n, n >= 10 && now-at >= faultStreak
}

// waitRecovered keeps the load going until every target has been answered
// by Redis alone for faultStreak, or the recovery bound has passed (check
// reports it).
func (l *faultLoad) waitRecovered(healed time.Duration) {
	for l.now() < healed+faultRecovery+faultStreak {
		all := true
		for i := range l.targets {
			if _, _, ok := l.recovery(i, healed, l.now()); !ok {
				all = false
			}
		}
		if all {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// faultWindow places a fault on the load's clock: injecting it began at
// begin (requests that ended before were answered by a healthy Redis); it
// certainly held every request that started at or after from and ended by
// to; it was healed at to.
type faultWindow struct {
	fault           string
	begin, from, to time.Duration
}

// failAnswer reports whether s is what fail mode mode answers.
func failAnswer(mode string, s faultSample) bool {
	switch mode {
	case "open":
		return s.source == sourceFailOpen && s.code == http.StatusOK
	case "closed":
		return s.source == sourceFailClosed && s.code == http.StatusServiceUnavailable &&
			s.body == string(unavailableBody) && s.retryAfter == "1"
	case "local":
		return s.source == sourceLocal && s.code == http.StatusOK
	}
	return false
}

// check asserts the contract on every recorded request and logs a summary
// per target. Call it after halt.
func (l *faultLoad) check(t *testing.T, win faultWindow) {
	t.Helper()
	for i, tg := range l.targets {
		l.mu.Lock()
		samples := l.samples[i]
		l.mu.Unlock()
		var warm, inFault, slow, bad int
		var worst, worstFault time.Duration
		report := func(format string, args ...any) {
			if bad++; bad <= 5 {
				t.Errorf("%s, fail %s: "+format, append([]any{win.fault, tg.mode}, args...)...)
			}
		}
		for _, s := range samples {
			worst = max(worst, s.took())
			if s.panic != "" {
				t.Fatalf("%s, fail %s: %s", win.fault, tg.mode, s.panic)
			}
			if s.err != nil {
				report("ServeHTTP returned %v", s.err)
			}
			if s.took() > faultTimeout+faultMargin {
				report("request at %v took %v, more than the timeout %v + %v", s.start, s.took(), faultTimeout, faultMargin)
			}
			redisOK := s.fromRedis() && s.code == http.StatusOK
			if !redisOK && !failAnswer(tg.mode, s) {
				report("request at %v: status %d source %q body %q: neither a Redis decision nor fail %s",
					s.start, s.code, s.source, s.body, tg.mode)
			}
			switch {
			case s.end < win.begin:
				warm++
				if !s.fromRedis() {
					report("before the fault, request at %v decided by %q", s.start, s.source)
				}
			case s.start >= win.from && s.end <= win.to:
				inFault++
				worstFault = max(worstFault, s.took())
				if s.took() >= faultTimeout/2 {
					slow++
				}
				if !failAnswer(tg.mode, s) {
					report("during the fault, request at %v (took %v): status %d source %q, want fail %s",
						s.start, s.took(), s.code, s.source, tg.mode)
				}
			}
		}
		if win.begin > 0 && warm < 5 {
			t.Errorf("%s, fail %s: only %d requests before the fault", win.fault, tg.mode, warm)
		}
		if inFault < 3 {
			t.Errorf("%s, fail %s: only %d requests while the fault held (%v to %v)", win.fault, tg.mode, inFault, win.from, win.to)
		}
		// The breaker spares most requests of an outage the timeout: only
		// those that open it and its probes pay it.
		if slow > 10+inFault/4 {
			t.Errorf("%s, fail %s: %d of %d requests during the fault paid the timeout: the circuit breaker did not open",
				win.fault, tg.mode, slow, inFault)
		}
		at, n, ok := l.recovery(i, win.to, l.haltedAt)
		if !ok || at-win.to > faultRecovery {
			t.Errorf("%s, fail %s: no recovery: last answer not from Redis ended %v after the heal, %d Redis answers since",
				win.fault, tg.mode, at-win.to, n)
		}
		if st := tg.h.breaker.State(); st != limiter.Closed {
			t.Errorf("%s, fail %s: circuit %v after recovery, want closed", win.fault, tg.mode, st)
		}
		t.Logf("%s, fail %-6s: %4d requests: %3d before, %4d during the fault (all fail %s, %d paid the timeout, slowest %v), back to Redis %v after the heal; slowest request %v",
			win.fault, tg.mode, len(samples), warm, inFault, tg.mode, slow, worstFault.Round(time.Millisecond),
			(at - win.to).Round(time.Millisecond), worst.Round(time.Millisecond))
	}
}

// faultBurst sends limit+2 sequential requests with one fresh key through h
// and checks that exactly limit are admitted, all decided by want (sourceLocal:
// the in-process store, this instance alone; "redis": Redis, whose denials
// may then come from the deny cache), each within the timeout.
func faultBurst(t *testing.T, h *Handler, key string, limit int, want string) {
	t.Helper()
	t0 := time.Now()
	for i := 0; i < limit+2; i++ {
		s := serveFault(h, key, t0)
		if s.panic != "" {
			t.Fatal(s.panic)
		}
		wantCode := http.StatusOK
		if i >= limit {
			wantCode = http.StatusTooManyRequests
		}
		srcOK := s.source == want || (want == faultRedis && wantCode != http.StatusOK && s.source == sourceDenyCache)
		if s.err != nil || s.code != wantCode || !srcOK {
			t.Errorf("burst %q request %d: status %d source %q err %v, want %d from %s",
				key, i+1, s.code, s.source, s.err, wantCode, want)
		}
		if s.took() > faultTimeout+faultMargin {
			t.Errorf("burst %q request %d took %v", key, i+1, s.took())
		}
	}
}

// faultLogged checks that the handlers logged the store's own error (the
// first failure of a handler is logged; later ones in the burst are counted).
func faultLogged(t *testing.T, targets []*faultTarget, want string) {
	t.Helper()
	var seen []string
	for _, tg := range targets {
		for _, e := range tg.logs.FilterLevelExact(zapcore.ErrorLevel).All() {
			msg := fmt.Sprint(e.ContextMap()["error"])
			if strings.Contains(msg, want) {
				return
			}
			seen = append(seen, msg)
		}
	}
	t.Errorf("no handler logged a %s error; logged: %q", want, seen)
}

// commandCalls returns the calls count of a command in INFO commandstats.
func commandCalls(t *testing.T, srv *redistest.Server, cmd string) int64 {
	t.Helper()
	prefix := "cmdstat_" + cmd + ":calls="
	for line := range strings.SplitSeq(srv.CLI(t, "INFO", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
}

// infoField returns an integer field of an INFO section.
func infoField(t *testing.T, srv *redistest.Server, section, field string) int64 {
	t.Helper()
	info := srv.CLI(t, "INFO", section)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s: %v", section, field, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s:\n%s", section, field, info)
	return 0
}

// ---------------------------------------------------------------------------
// stallProxy: a loopback TCP proxy in front of a Redis that can be switched
// to stall: it keeps reading from both sides but holds every byte until it
// is switched back, like a network path that stops delivering. Close (a
// test cleanup) closes every connection and waits for its goroutines.

type stallProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64

	mu      sync.Mutex
	stalled bool
	release chan struct{} // closed when a stall ends
	conns   map[net.Conn]struct{}
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's 127.0.0.1 address.
func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// Stall switches holding bytes on or off; switching it off delivers what
// was held.
func (p *stallProxy) Stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && !p.stalled:
		p.stalled, p.release = true, make(chan struct{})
	case !on && p.stalled:
		p.stalled = false
		close(p.release)
	}
}

// Close stops the proxy: listener, connections, goroutines.
func (p *stallProxy) Close() {
	p.once.Do(func() {
		close(p.closed)
		_ = p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// track registers a connection pair, or closes it if the proxy is closed.
func (p *stallProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	default:
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *stallProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// pass blocks while the proxy is stalled; false if it closed meanwhile.
func (p *stallProxy) pass() bool {
	p.mu.Lock()
	stalled, release := p.stalled, p.release
	p.mu.Unlock()
	if !stalled {
		return true
	}
	select {
	case <-release:
		return true
	case <-p.closed:
		return false
	}
}

// pipe copies src to dst, holding bytes while stalled; when either side
// ends, both connections are closed (which ends the other pipe too).
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
