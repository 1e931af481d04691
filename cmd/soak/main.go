// Command soak drives the engine's stores with many distinct keys for a
// bounded time and checks that their memory stays flat once keys expire.
//
//	go run ./cmd/soak [-duration 3m] [-window 5s] [-rate 2000] [-hot 200] [-hot-rate 1000]
//
// It starts its own redis-server with internal/redistest's Launch (a free
// 127.0.0.1 port, never 6379, a temporary directory, killed at the end), and decides every request on four
// limiters built directly on the engine: the Redis store
// (limiter.NewRedisStore) and the in-process store (limiter.NewMemoryStore),
// each with sliding_log and sliding_counter, all with the same short window,
// so keys start expiring a few seconds in. Traffic: -rate new random keys
// per second (each seen once: the worst case for memory, a key per client
// that never comes back) plus -hot-rate requests per second over -hot keys
// that are kept over their limit.
//
// Every -interval it prints the elapsed time, the requests sent (each is
// decided by the four limiters), Redis
// used_memory (INFO memory) and DBSIZE, the in-process store's key count
// (MemoryStore.Len) and the Go heap in use after a GC (runtime.MemStats
// HeapInuse). At the end it takes the samples after warm-up (two windows)
// in the second half of the run and checks that DBSIZE, used_memory, the
// in-process key count and the heap each stay within -band (max/min), and
// that no store call failed; it prints a one-line verdict and exits 1 if any
// check fails (2 if it could not run).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// maxDuration bounds a run, whatever the flags say.
const maxDuration = 30 * time.Minute

type config struct {
	Duration  time.Duration // how long traffic runs
	Window    time.Duration // every limiter's window
	Rate      int           // new keys per second
	Hot       int           // hot keys
	HotRate   int           // requests per second over the hot keys
	Limit     int64         // limit of the new keys
	HotLimit  int64         // limit of the hot keys (kept over it)
	Interval  time.Duration // between samples
	Band      float64       // max/min allowed after warm-up
	Workers   int           // goroutines deciding requests
	RedisBin  string        // redis-server binary
	CallLimit time.Duration // timeout of one store call
}

func defaultConfig() config {
	return config{
		Duration:  3 * time.Minute,
		Window:    5 * time.Second,
		Rate:      2000,
		Hot:       200,
		HotRate:   1000,
		Limit:     10,
		HotLimit:  5,
		Interval:  10 * time.Second,
		Band:      1.5,
		Workers:   16,
		RedisBin:  "redis-server",
		CallLimit: time.Second,
	}
}

func main() {
	cfg := defaultConfig()
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long traffic runs (at most 30m)")
	flag.DurationVar(&cfg.Window, "window", cfg.Window, "the limiters' window")
	flag.IntVar(&cfg.Rate, "rate", cfg.Rate, "new random keys per second")
	flag.IntVar(&cfg.Hot, "hot", cfg.Hot, "number of hot keys")
	flag.IntVar(&cfg.HotRate, "hot-rate", cfg.HotRate, "requests per second over the hot keys")
	flag.DurationVar(&cfg.Interval, "interval", cfg.Interval, "time between samples")
	flag.Float64Var(&cfg.Band, "band", cfg.Band, "largest max/min ratio allowed after warm-up")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "goroutines deciding requests")
	flag.StringVar(&cfg.RedisBin, "redis-server", cfg.RedisBin, "redis-server binary")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ok, err := run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// sample is one line of the report.
type sample struct {
	elapsed   time.Duration
	requests  int64
	usedMem   int64 // Redis used_memory
	dbsize    int64
	memKeys   int64 // in-process store keys
	heapInuse int64 // Go heap in use after a GC
}

// limiterSpec is one of the four limiters.
type limiterSpec struct {
	name string
	lim  *limiter.Limiter
}

// job is one request: an identity, and whether it is a hot one.
type job struct {
	id  string
	hot bool
}

// counters are the run's totals.
type counters struct {
	requests, decisions, denied, errors, dropped atomic.Int64
	lastErr                                      atomic.Pointer[error]
}

func (c *counters) fail(err error) {
	c.errors.Add(1)
	c.lastErr.Store(&err)
}

// run soaks the stores and reports to out; ok is the verdict.
func run(ctx context.Context, cfg config, out io.Writer) (ok bool, err error) {
	if cfg.Duration <= 0 || cfg.Duration > maxDuration {
		return false, fmt.Errorf("-duration must be in (0, %v], got %v", maxDuration, cfg.Duration)
	}
	if cfg.Window < time.Millisecond || cfg.Interval <= 0 || cfg.Workers <= 0 || cfg.Rate < 0 || cfg.HotRate < 0 || (cfg.HotRate > 0 && cfg.Hot <= 0) {
		return false, errors.New("bad flags: -window >= 1ms, -interval > 0, -workers > 0, rates >= 0, -hot > 0 with -hot-rate")
	}

	srv, err := redistest.Launch(redistest.LaunchOptions{Bin: cfg.RedisBin})
	if err != nil {
		return false, err
	}
	defer srv.Stop()
	client := redis.NewClient(&redis.Options{
		Addr: srv.Addr(), PoolSize: 2 * cfg.Workers, DialTimeout: time.Second,
		ReadTimeout: cfg.CallLimit, WriteTimeout: cfg.CallLimit, ContextTimeoutEnabled: true,
		MaxRetries: -1, DisableIdentity: true, Protocol: 2,
	})
	defer client.Close()
	version := "?"
	if info, err := redistest.Info(ctx, client, "server"); err == nil {
		version = info["redis_version"]
	}
	mem := limiter.NewMemoryStore()
	defer mem.Close()

	var specs []limiterSpec
	for _, st := range []struct {
		name    string
		backend limiter.Backend
	}{
		{"redis", limiter.Backend{Store: limiter.NewRedisStore(client), Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1}},
		{"memory", limiter.Backend{Store: mem, Source: limiter.SourceMemory}},
	} {
		for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingCounter} {
			lim, err := limiter.New(limiter.Policy{Name: st.name + "-" + alg.String(), KeyPrefix: "soak:", Algorithm: alg,
				Windows: []limiter.Window{{Duration: cfg.Window}}, Timeout: cfg.CallLimit}, st.backend)
			if err != nil {
				return false, err
			}
			specs = append(specs, limiterSpec{name: st.name + "/" + alg.String(), lim: lim})
		}
	}

	fmt.Fprintf(out, "soak: redis-server %s on %s; %v of traffic, window %v: %d new keys/s (limit %d) + %d req/s over %d hot keys (limit %d), each decided by %d limiters (redis and memory × sliding_log and sliding_counter)\n",
		version, srv.Addr(), cfg.Duration, cfg.Window, cfg.Rate, cfg.Limit, cfg.HotRate, cfg.Hot, cfg.HotLimit, len(specs))
	fmt.Fprintf(out, "%8s %10s %14s %9s %10s %12s\n", "elapsed", "requests", "redis_used_mem", "dbsize", "mem_keys", "heap_inuse")

	var c counters
	jobs := make(chan job, 4*cfg.Workers)
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()

	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				decide(specs, cfg, j, &c)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(jobs)
		generate(runCtx, cfg, jobs, &c)
	}()

	start := time.Now()
	var samples []sample
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-tick.C:
			s, err := measure(ctx, client, mem)
			if err != nil {
				return false, err
			}
			s.elapsed = time.Since(start).Round(100 * time.Millisecond)
			s.requests = c.requests.Load()
			samples = append(samples, s)
			fmt.Fprintf(out, "%8v %10d %14s %9d %10d %12s\n",
				s.elapsed, s.requests, mib(s.usedMem), s.dbsize, s.memKeys, mib(s.heapInuse))
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return false, errors.New("interrupted")
	}

	fmt.Fprintf(out, "requests %d, decisions %d (%d denied), store errors %d, requests dropped by a slow consumer %d\n",
		c.requests.Load(), c.decisions.Load(), c.denied.Load(), c.errors.Load(), c.dropped.Load())
	if p := c.lastErr.Load(); p != nil {
		fmt.Fprintf(out, "last store error: %v\n", *p)
	}
	return verdict(cfg, samples, c.errors.Load(), out), nil
}

// generate feeds jobs at the configured rates in 10ms steps until ctx ends.
// A job the workers cannot take at once is dropped (and counted), so a slow
// machine lowers the load instead of queueing without bound.
func generate(ctx context.Context, cfg config, jobs chan<- job, c *counters) {
	const step = 10 * time.Millisecond
	tick := time.NewTicker(step)
	defer tick.Stop()
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	var fresh, hot float64 // carried fractions
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fresh += float64(cfg.Rate) * step.Seconds()
		hot += float64(cfg.HotRate) * step.Seconds()
		for ; fresh >= 1; fresh-- {
			send(jobs, job{id: strconv.FormatUint(rng.Uint64(), 36)}, c)
		}
		for ; hot >= 1; hot-- {
			send(jobs, job{id: "hot-" + strconv.Itoa(rng.IntN(cfg.Hot)), hot: true}, c)
		}
	}
}

func send(jobs chan<- job, j job, c *counters) {
	select {
	case jobs <- j:
	default:
		c.dropped.Add(1)
	}
}

// decide runs one request through every limiter.
func decide(specs []limiterSpec, cfg config, j job, c *counters) {
	c.requests.Add(1)
	limit := cfg.Limit
	if j.hot {
		limit = cfg.HotLimit
	}
	for i := range specs {
		sp := &specs[i]
		in := limiter.Input{Identity: j.id, Limits: []int64{limit}}
		d, err := sp.lim.Decide(context.Background(), &in)
		c.decisions.Add(1)
		switch {
		case err != nil:
			c.fail(fmt.Errorf("%s: %w", sp.name, err))
		case d.Err != nil:
			c.fail(fmt.Errorf("%s: %w", sp.name, d.Err))
		case d.Outcome != limiter.OutcomeAllowed:
			c.denied.Add(1)
		}
	}
}

// measure reads Redis INFO memory and DBSIZE, the in-process store's key
// count and the Go heap in use after a GC.
func measure(ctx context.Context, client *redis.Client, mem *limiter.MemoryStore) (sample, error) {
	var s sample
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := redistest.Info(ctx, client, "memory")
	if err != nil {
		return s, err
	}
	if s.usedMem, err = redistest.InfoInt(info, "used_memory"); err != nil {
		return s, err
	}
	if s.dbsize, err = client.DBSize(ctx).Result(); err != nil {
		return s, fmt.Errorf("DBSIZE: %w", err)
	}
	s.memKeys = int64(mem.Len())
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.heapInuse = int64(ms.HeapInuse)
	return s, nil
}

// verdict checks the samples after warm-up in the second half of the run
// and prints one line per figure and the verdict.
func verdict(cfg config, samples []sample, storeErrors int64, out io.Writer) bool {
	from := max(2*cfg.Window, cfg.Duration/2)
	var steady []sample
	for _, s := range samples {
		if s.elapsed >= from {
			steady = append(steady, s)
		}
	}
	if len(steady) < 2 {
		fmt.Fprintf(out, "VERDICT: FAIL — %d samples after %v, need 2: run longer or sample more often\n", len(steady), from)
		return false
	}
	ok := storeErrors == 0
	var parts []string
	for _, f := range []struct {
		name   string
		get    func(sample) int64
		format func(int64) string
	}{
		{"dbsize", func(s sample) int64 { return s.dbsize }, itoa},
		{"redis used_memory", func(s sample) int64 { return s.usedMem }, mib},
		{"memory-store keys", func(s sample) int64 { return s.memKeys }, itoa},
		{"go heap in use", func(s sample) int64 { return s.heapInuse }, mib},
	} {
		lo, hi := f.get(steady[0]), f.get(steady[0])
		for _, s := range steady[1:] {
			lo, hi = min(lo, f.get(s)), max(hi, f.get(s))
		}
		ratio := float64(hi) / float64(max(lo, 1))
		mark := "ok"
		if lo <= 0 || ratio >= cfg.Band {
			mark, ok = "OUT OF BAND", false
		}
		parts = append(parts, fmt.Sprintf("%s %s..%s (x%.2f, %s)", f.name, f.format(lo), f.format(hi), ratio, mark))
	}
	result := "PASS"
	if !ok {
		result = "FAIL"
	}
	fmt.Fprintf(out, "VERDICT: %s — from %v to %v (%d samples, band x%.2f, store errors %d): %s\n",
		result, from, steady[len(steady)-1].elapsed, len(steady), cfg.Band, storeErrors, strings.Join(parts, "; "))
	return ok
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "MiB" }
