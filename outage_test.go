package slidingratelimit

// Redis killed or hung under load: fail open, fail local, the circuit
// breaker, the recovery.

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestOutageUnderLoad: 8 goroutines send requests through one handler
// (Redis timeout 100ms); Redis is killed while they run, then restarted.
//   - no request takes longer than the timeout plus 150ms;
//   - the circuit breaker opens during the outage;
//   - fail open admits everything meanwhile (source fail_open);
//   - fail local still enforces the limit per instance: limit 10 on a
//     hot key fresh at the kill, frozen clock, so at most 10 admitted
//     locally, the rest 429;
//   - after the restart, decisions come from Redis again within a few
//     seconds, with the same handler (no Caddy restart).
//
// Not parallel: it asserts latencies, which CPU-bound neighbours (on a
// small machine, under -race) would stretch whatever the limiter does.
func TestOutageUnderLoad(t *testing.T) {
	for _, mode := range []string{"open", "local"} {
		// killed: connections refused at once; hung (SIGSTOP, then SIGCONT):
		// every call to Redis would cost the full timeout.
		for _, how := range []string{"killed", "hung"} {
			t.Run(mode+"/"+how, func(t *testing.T) {
				runOutageUnderLoad(t, mode, how == "hung")
			})
		}
	}
}

func runOutageUnderLoad(t *testing.T, mode string, hang bool) {
	const (
		workers  = 8
		timeout  = 100 * time.Millisecond
		margin   = 150 * time.Millisecond
		limit    = 10
		upFor    = 700 * time.Millisecond  // load before the kill
		downFor  = 1200 * time.Millisecond // outage
		recovery = 6 * time.Second         // breaker's max cool-down (5s) + slack
		pace     = time.Millisecond        // between a worker's requests: load, not a CPU-bound spin
	)
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: Amount(strconv.Itoa(limit)), Window: caddy.Duration(time.Minute),
		Fail: mode, Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(timeout)}}
	logs := provision(t, h, newTestClock()) // frozen: the hot key's window never ends
	breaker := redisBreaker(t, h)

	type key struct {
		phase  int32 // 0 up, 1 down, 2 restarted
		source string
		code   int
		hot    bool
	}
	var (
		phase               atomic.Int32
		stop                atomic.Bool
		mu                  sync.Mutex
		counts              = map[key]int{}
		slowest             time.Duration
		problems            []string
		backAt              atomic.Int64 // unix ns of the first redis decision after the restart
		sawOpen             atomic.Bool
		downTotal, downSlow int // requests while Redis is away, and those that waited for it
		wg                  sync.WaitGroup
	)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				// The hot key of the outage is fresh when Redis goes away:
				// a key already denied before would be denied by the deny
				// cache, never reaching the local store.
				p := phase.Load()
				id, hot := "hot-up", false
				if p > 0 {
					id, hot = "hot-down", true
				}
				if n%2 == 1 {
					id, hot = fmt.Sprintf("cold-%d-%d", g, n), false
				}
				o := serveOutcome(h, map[string]string{"X-API-Key": id})
				mu.Lock()
				counts[key{p, o.source, o.code, hot}]++
				slowest = max(slowest, o.took)
				if p == 1 {
					downTotal++
					if o.took >= timeout/2 {
						downSlow++
					}
				}
				if o.took > timeout+margin || o.err != nil || o.code >= 500 {
					problems = append(problems, fmt.Sprintf("phase %d: status %d source %q took %s err %v", p, o.code, o.source, o.took, o.err))
				}
				mu.Unlock()
				if p == 2 && o.source == "redis" {
					backAt.CompareAndSwap(0, time.Now().UnixNano())
				}
				time.Sleep(pace)
			}
		}()
	}
	// The breaker's state, sampled while Redis is down.
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for !stop.Load() {
			if phase.Load() == 1 && breaker.State() == limiter.Open {
				sawOpen.Store(true)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { // stop the load whatever happens
		stop.Store(true)
		wg.Wait()
		<-sampled
	}()

	// A phase starts just before its event: requests of phase 1 may still
	// reach Redis while it dies, those of phase 2 miss it while it starts.
	time.Sleep(upFor)
	phase.Store(1)
	if hang {
		srv.Pause()
	} else {
		srv.Kill()
	}
	time.Sleep(downFor)
	phase.Store(2)
	if hang {
		srv.Resume()
	} else {
		srv.Restart()
	}
	restarted := time.Now()
	for backAt.Load() == 0 && time.Since(restarted) < recovery {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a little load on the recovered Redis
	stop.Store(true)
	wg.Wait()
	<-sampled

	t.Logf("fail %s: slowest request %s; outcomes (phase, source, status, hot key): %v", mode, slowest, counts)
	for i, p := range problems {
		if i == 10 {
			t.Errorf("... and %d more", len(problems)-10)
			break
		}
		t.Errorf("request over %s or failed: %s", timeout+margin, p)
	}
	if counts[key{0, "redis", http.StatusOK, false}] == 0 {
		t.Fatalf("no request was decided by Redis before the kill: %v", counts)
	}
	if !sawOpen.Load() {
		t.Errorf("the circuit breaker never opened during the outage")
	}
	// With the circuit open a request costs no timeout: only the calls in
	// flight when Redis went away, those until the circuit opened and one
	// probe per cool-down may wait (a handful); not a steady share.
	t.Logf("while Redis was away: %d requests, %d of them waited %s or more", downTotal, downSlow, timeout/2)
	if downTotal < 200 {
		t.Errorf("only %d requests while Redis was away: too little load to judge", downTotal)
	}
	if downSlow > 40 {
		t.Errorf("%d of %d requests waited for Redis while it was away: the circuit breaker does not spare the timeout", downSlow, downTotal)
	}
	if b := backAt.Load(); b == 0 {
		t.Errorf("no decision from Redis within %s of its restart (circuit %s); logs:\n%s", recovery, breaker.State(), renderLogs(logs))
	} else {
		t.Logf("decisions from redis again %s after the restart", time.Unix(0, b).Sub(restarted).Round(time.Millisecond))
	}

	var downOK, local, localOKHot, localDeniedHot int
	for k, n := range counts {
		if k.source == sourceLocal {
			local += n
			if k.hot && k.code == http.StatusOK {
				localOKHot += n
			}
		}
		if k.hot && k.phase == 1 && k.code == http.StatusTooManyRequests && k.source != "redis" {
			localDeniedHot += n // by the local store, or by the deny cache after it
		}
		if k.phase == 1 && k.code == http.StatusOK {
			downOK += n
		}
		if mode == "open" && k.phase == 1 && k.source != sourceFailOpen && k.source != "redis" {
			t.Errorf("fail open, Redis down: %d requests with source %q", n, k.source)
		}
		if mode == "open" && k.source == sourceLocal {
			t.Errorf("fail open decided %d requests locally", n)
		}
	}
	switch mode {
	case "open":
		if counts[key{1, sourceFailOpen, http.StatusOK, true}] == 0 || counts[key{1, sourceFailOpen, http.StatusOK, false}] == 0 {
			t.Errorf("fail open admitted nothing while Redis was down: %v", counts)
		}
	case "local":
		if local == 0 {
			t.Fatalf("fail local: no request decided locally while Redis was down: %v", counts)
		}
		if localOKHot > limit {
			t.Errorf("fail local admitted %d requests on the hot key, over its limit of %d per window", localOKHot, limit)
		}
		if localOKHot == 0 || localDeniedHot == 0 {
			t.Errorf("fail local on the hot key: %d admitted, %d denied; want the limit enforced (some of each)", localOKHot, localDeniedHot)
		}
	}
	if downOK == 0 {
		t.Errorf("nothing admitted while Redis was down (fail %s)", mode)
	}
	if after := counts[key{2, "redis", http.StatusOK, false}]; after == 0 && backAt.Load() != 0 {
		t.Errorf("no cold request admitted by Redis after the restart: %v", counts)
	}
}

// TestFailLocalBound is the bound fail local keeps across an outage: one
// node admits at most the limit from Redis and the limit again from its
// in-process store in any window: 2x the limit, never more. (N nodes:
// (N+1)x; and a Redis that comes back without its data counts from zero
// again.) Redis does not learn what the node admitted alone. The outage
// here is a Redis that hangs and comes back with its data.
func TestFailLocalBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := newTestClock() // frozen: everything below falls in one window
	h := &Handler{Name: uniqueName(), Limit: "5", Window: caddy.Duration(time.Minute), Fail: "local",
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(100 * time.Millisecond)}}
	provision(t, h, clock)
	admitted := map[string]int{}
	send := func(n int) {
		for i := 0; i < n; i++ {
			w, r, repl := newRequest(nil)
			if err := h.ServeHTTP(w, r, nextOK); err != nil {
				t.Fatal(err)
			}
			if w.Code == http.StatusOK {
				src, _ := repl.GetString(phSource)
				admitted[src]++
			}
		}
	}
	// Exactly the limit before the outage: a denial now would be cached,
	// and the deny cache would answer it during the outage too, as Redis
	// would (the bound is for keys Redis had room for).
	send(5)
	srv.Pause()
	send(20)
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second) // until the breaker probes Redis again
	for {
		w, r, repl := newRequest(nil)
		_ = h.ServeHTTP(w, r, nextOK)
		if src, _ := repl.GetString(phSource); src == "redis" || src == sourceDenyCache {
			if w.Code == http.StatusOK {
				admitted["redis"]++
			}
			break
		}
		if w.Code == http.StatusOK {
			admitted[sourceLocal]++
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis did not come back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	send(20)
	if admitted["redis"] != 5 || admitted[sourceLocal] != 5 {
		t.Fatalf("admitted %v in one window, want 5 by Redis and 5 by the node alone: 2x the limit", admitted)
	}
}

// TestRedisDownAtStartWarnsOnce: Caddy starts with Redis down. The
// limiters load, requests follow the fail mode, and one warning says Redis
// does not answer: one for the Redis two limiters share, not one per
// limiter or per request.
func TestRedisDownAtStartWarnsOnce(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: Redis is down
	core, logs := observer.New(zapcore.WarnLevel)
	var hs []*Handler
	for i := 0; i < 2; i++ {
		h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "5", Window: caddy.Duration(time.Minute),
			Redis: &RedisConfig{Addresses: []string{addr}}}
		h.rt = &provisioned{logger: zap.New(core)}
		provision(t, h, nil) // Caddy starts
		h.rt.logger = zap.New(core)
		hs = append(hs, h)
	}
	warned := func() int { return len(logs.FilterMessageSnippet("redis does not answer at start").All()) }
	deadline := time.Now().Add(5 * time.Second)
	for warned() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // the check runs beside the start, within dial_timeout + timeout
	}
	for _, h := range hs {
		for i := 0; i < 20; i++ {
			if o := mustServe(t, h, map[string]string{"X-API-Key": "K"}); o.code != http.StatusOK || o.source != sourceFailOpen {
				t.Fatalf("request with Redis down: %d from %q, want 200 from fail_open", o.code, o.source)
			}
		}
	}
	lines := logs.FilterMessageSnippet("redis does not answer at start").All()
	if len(lines) != 1 {
		t.Fatalf("%d warnings that Redis does not answer, want 1:\n%s", len(lines), renderLogs(logs))
	}
	if l := lines[0]; l.Level != zapcore.WarnLevel || l.ContextMap()["redis"] != addr {
		t.Errorf("warning %v %v, want a warning naming redis %s", l.Level, l.ContextMap(), addr)
	}
}
