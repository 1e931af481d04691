package slidingratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// BenchmarkHandlerCPU is the Caddy side of a check under concurrent load:
// 64 requests in flight (b.SetParallelism), so that Redis checks batch as
// they do in Caddy under load, and the process's CPU time (getrusage: user
// + system, every thread) per request reported as cpu-µs/op. CPU time per
// request moves much less with a busy host than wall-clock throughput does;
// compare a row with baseline (the harness alone) in the same run.
//
//	go test -run '^$' -bench BenchmarkHandlerCPU -cpu 1 -benchtime 50000x .
func BenchmarkHandlerCPU(b *testing.B) {
	srv := redistest.Start(b)
	b.Run("baseline", func(b *testing.B) { runCPUBench(b, nil, benchKeys) })
	for _, store := range []string{"memory", "redis"} {
		for _, alg := range []string{"sliding_log", "sliding_counter"} {
			b.Run(store+"/"+alg, func(b *testing.B) {
				runCPUBench(b, benchHandler(b, store, alg, srv, "10000"), benchKeys)
			})
		}
	}
	// cmd/bench's two harness settings of the in-process log, over 10,000
	// keys: 10,000 a minute (bench: no entry gets old within a run) and 100
	// a second (outside: entries expire while the keys come back).
	for _, rate := range []struct {
		name, limit string
		window      time.Duration
	}{{"10000_a_minute", "10000", time.Minute}, {"100_a_second", "100", time.Second}} {
		b.Run("memory/sliding_log/"+rate.name, func(b *testing.B) {
			runCPUBench(b, memoryLogHandler(b, rate.limit, rate.window), 10000)
		})
	}
}

func runCPUBench(b *testing.B, h *Handler, keys int64) {
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	var seq atomic.Int64
	b.SetParallelism(64)
	b.ReportAllocs()
	before := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := httptest.NewRecorder()
		for pb.Next() {
			r := newBenchRequest("k" + strconv.FormatInt(seq.Add(1)%keys, 10))
			for k := range w.Header() {
				delete(w.Header(), k)
			}
			if h == nil {
				_ = next.ServeHTTP(w, r)
			} else if err := h.ServeHTTP(w, r, next); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-before)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// newBenchRequest is a request as Caddy's server prepares it (its vars, its
// replacer) with X-Key set, as runBench makes them.
func newBenchRequest(key string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey,
		map[string]any{caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: "192.0.2.1"}))
	r.Header.Set("X-Key", key)
	caddyhttp.NewTestReplacer(r)
	return r
}

// memoryLogHandler is benchHandler's in-process sliding_log with its own
// window.
func memoryLogHandler(b *testing.B, limit string, window time.Duration) *Handler {
	h := &Handler{Name: "bench_cpu_sliding_log_" + limit, Algorithm: "sliding_log",
		Key: "{http.request.header.X-Key}", Limit: Amount(limit), Window: caddy.Duration(window), WarnAt: -1}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(func() { h.Cleanup(); cancel() })
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	h.rt.logger = zap.NewNop()
	return h
}
