package slidingratelimit

// The fault suite's load: handlers under load, every request timed, and
// what a fault must and must not do to them.

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

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
	stalls  *stallMeter
}

// stallMeter records the process's own stalls: stretches in which a
// goroutine that asked to sleep 2 ms was not run for longer, so that the
// machine or the Go scheduler held the whole process, not Redis. A
// request's time overlapping a stall is the machine's, not the fail mode's
// (a request held 700 ms once in a stall of a loaded host, every goroutine
// with it).
type stallMeter struct {
	t0     time.Time
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	stalls [][2]time.Duration // since t0
}

// stallTick is the meter's sleep; stallSlack what it may oversleep before
// the oversleep counts as a stall.
const (
	stallTick  = 2 * time.Millisecond
	stallSlack = 10 * time.Millisecond
)

// startStallMeter measures from now, on the clock that starts at t0, until
// halt.
func startStallMeter(t0 time.Time) *stallMeter {
	m := &stallMeter{t0: t0, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		prev := time.Since(t0)
		for {
			select {
			case <-m.stop:
				return
			default:
			}
			time.Sleep(stallTick)
			now := time.Since(t0)
			if now-prev > stallTick+stallSlack {
				m.mu.Lock()
				m.stalls = append(m.stalls, [2]time.Duration{prev + stallTick, now})
				m.mu.Unlock()
			}
			prev = now
		}
	}()
	return m
}

func (m *stallMeter) halt() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

// stalled is how much of [from, to] the process spent in its own stalls.
func (m *stallMeter) stalled(from, to time.Duration) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var d time.Duration
	for _, st := range m.stalls {
		if lo, hi := max(st[0], from), min(st[1], to); hi > lo {
			d += hi - lo
		}
	}
	return d
}

// overTimeout reports whether s took longer than the timeout and margin
// once the process's own stalls are taken out, with the stalled time.
func (m *stallMeter) overTimeout(s faultSample) (bool, time.Duration) {
	return m.overTimeoutOf(s, faultTimeout)
}

// overTimeoutOf is overTimeout for a handler whose Redis timeout is
// timeout.
func (m *stallMeter) overTimeoutOf(s faultSample, timeout time.Duration) (bool, time.Duration) {
	if s.took() <= timeout+faultMargin {
		return false, 0
	}
	st := m.stalled(s.start, s.end)
	return s.took()-st > timeout+faultMargin, st
}

var faultLoadSeq atomic.Int64

// startFaultLoad starts the load. keys is the number of distinct keys each
// worker cycles through; 0 gives every request a fresh key, so Redis admits
// each one.
func startFaultLoad(t *testing.T, targets []*faultTarget, keys int) *faultLoad {
	l := &faultLoad{t0: time.Now(), targets: targets, stop: make(chan struct{}), samples: make([][]faultSample, len(targets))}
	id := faultLoadSeq.Add(1)
	l.stalls = startStallMeter(l.t0)
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

// faultWarmMin is how many requests of each target check asserts before
// the fault (a fault begun on a handler that has answered none tests
// nothing of the warm path).
const faultWarmMin = 5

// warmUp lets the load run for d, and then on until every target has
// answered faultWarmMin requests (at most 20s more: a machine too loaded to
// answer them by then fails check's count rather than hanging), so that the
// fault begins after a warm-up of answered requests, not of elapsed time,
// which a loaded machine spends provisioning and loading the script.
func (l *faultLoad) warmUp(d time.Duration) {
	time.Sleep(d)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		l.mu.Lock()
		least := faultMaxPerWorker * faultWorkers
		for _, s := range l.samples {
			least = min(least, len(s))
		}
		l.mu.Unlock()
		if least >= faultWarmMin {
			return
		}
	}
}

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
		l.stalls.halt()
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
			// Bounded by the timeout: the time the whole process stood
			// still (the machine's stall, measured beside the load) is
			// not the request's.
			if over, st := l.stalls.overTimeout(s); over {
				report("request at %v took %v (%v of it in the process's own stalls), more than the timeout %v + %v",
					s.start, s.took(), st, faultTimeout, faultMargin)
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
		if win.begin > 0 && warm < faultWarmMin {
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
		if st := tg.h.rt.breaker.State(); st != limiter.Closed {
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
	stalls := startStallMeter(t0)
	defer stalls.halt()
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
		if over, st := stalls.overTimeout(s); over {
			t.Errorf("burst %q request %d took %v (%v of it in the process's own stalls), more than the timeout %v + %v",
				key, i+1, s.took(), st, faultTimeout, faultMargin)
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
