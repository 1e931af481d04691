// Command bench is sliding_ratelimit's end-to-end benchmark. It builds this
// repository's Caddy, starts its own redis-server on a free loopback port,
// runs one Caddy with one site per case (no limiter, in-process, Redis per
// algorithm, a hot key over its limit with and without the deny cache),
// drives each site in turn with an HTTP load generator on 127.0.0.1 (wrk if
// installed, else a built-in Go generator), and prints one table of req/s,
// p50, p99, statuses and each site's ratio to the no-limiter site measured
// in the same run; then the Redis calls of the hot-key sites and the p99
// latency added by the Redis limiter at half of the no-limiter maximum.
//
//	go run ./cmd/bench                                  # every site, 10s each
//	go run ./cmd/bench -duration 3s -warmup 1s -sites none,memory_log,redis_log
//
// It needs redis-server on PATH (unless no selected site uses Redis) and
// sends traffic only to 127.0.0.1; every process it starts is stopped on
// exit, Ctrl-C included.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

func init() {
	// Children are started from main; Pdeathsig (see childAttr) fires when
	// the thread that started them exits, so keep main on one thread.
	runtime.LockOSThread()
}

type options struct {
	duration, warmup time.Duration
	conns, keys      int
	sites            string
	keep             bool
	jsonPath         string
	generator        string
	halfLoad         bool
	halfRate         float64
	rounds           int
	skipUnsupported  bool
	caddyBin         string
}

func main() {
	os.Exit(run())
}

func run() (code int) {
	defer cleanup.run()

	var o options
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load per site")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured warm-up load per site, before the measured period")
	flag.IntVar(&o.conns, "conns", 64, "concurrent keep-alive connections")
	flag.IntVar(&o.keys, "keys", 100000, "distinct X-Key values for the many-key sites (hot_* sites use one key)")
	flag.StringVar(&o.sites, "sites", "all", "comma-separated sites to run: "+strings.Join(siteNames(), ","))
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (Caddyfile, logs, binary)")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.generator, "generator", "auto", "load generator: auto (wrk if on PATH, else go), wrk or go")
	flag.BoolVar(&o.halfLoad, "halfload", true, "measure p99 of none and redis_log at half of redis_log's max rate (needs both sites)")
	flag.Float64Var(&o.halfRate, "half-rate", 0, "rate (req/s) of the half-load measurement; 0 means half of redis_log's max")
	flag.IntVar(&o.rounds, "rounds", 1, "run the whole site sequence this many times and report each site's median-req/s run")
	flag.BoolVar(&o.skipUnsupported, "skip-unsupported", false, "skip sites whose config this Caddy build rejects, instead of failing")
	flag.StringVar(&o.caddyBin, "caddy", "", "use this Caddy binary instead of building ./cmd/caddy (it must include the plugin)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./cmd/bench [flags]\n\n"+
			"End-to-end benchmark: builds ./cmd/caddy, starts its own redis-server and one Caddy\n"+
			"with one site per case, drives each with HTTP load on 127.0.0.1, prints a markdown table.\n\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if o.duration <= 0 || o.warmup < 0 || o.conns <= 0 || o.keys <= 0 || o.rounds <= 0 || o.halfRate < 0 {
		return fail(errors.New("-duration, -conns, -keys and -rounds must be positive, -warmup and -half-rate not negative"))
	}
	switch o.generator {
	case "auto", "go", "wrk":
	default:
		return fail(fmt.Errorf("-generator must be auto, go or wrk, got %q", o.generator))
	}
	sites, err := selectSites(o.sites)
	if err != nil {
		return fail(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once (children die by Pdeathsig)
	}()

	defer func() {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench: interrupted; stopping Caddy and redis-server")
			code = 130
		}
	}()

	b := &bench{o: o, ctx: ctx, loadAvg: loadAvg()}
	if n := runtime.NumCPU(); b.loadAvg > 0.5*float64(n) {
		logf("warning: load average %.2f on %d CPUs before the run: other processes compete for the CPUs, results will be low and noisy", b.loadAvg, n)
	}
	if err := b.run(sites); err != nil {
		if ctx.Err() != nil {
			return 130
		}
		return fail(err)
	}
	return 0
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	return 1
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// measurement is one site's result, whatever the generator.
type measurement struct {
	Generator string
	ReqPerSec float64
	P50, P99  time.Duration
	Responses uint64
	S2xx      uint64
	S429      uint64
	SOther    uint64
	Errors    uint64
	Elapsed   time.Duration
	LastErr   string
	// Redis script calls (EVALSHA+EVAL) during the measured period; -1 when
	// not measured (no Redis).
	RedisCalls int64
	// CaddyErrors is how many error lines Caddy logged during the site's
	// run (warm-up included), CaddyError the first of them.
	CaddyErrors int
	CaddyError  string
}

func fromLoad(r *loadResult) measurement {
	return measurement{
		Generator: r.Generator, ReqPerSec: r.reqPerSec(),
		P50: r.Latency.quantile(0.50), P99: r.Latency.quantile(0.99),
		Responses: r.Responses, S2xx: r.S2xx, S429: r.S429, SOther: r.SOther, Errors: r.Errors,
		Elapsed: r.Elapsed, LastErr: r.LastErr, RedisCalls: -1,
	}
}

type bench struct {
	o   options
	ctx context.Context

	dir      string
	caddyBin string
	redis    *redisServer
	env      []string
	wrk      string // wrk path, "" for the Go generator
	caddyLog string
	loadAvg  float64
	genDesc  string
}

func (b *bench) run(sites []site) error {
	ctx := b.ctx
	dir, err := os.MkdirTemp("", "sliding-ratelimit-bench-")
	if err != nil {
		return err
	}
	b.dir = dir
	if b.o.keep {
		logf("keeping %s", dir)
	} else {
		cleanup.add(func() { _ = os.RemoveAll(dir) })
	}
	// Caddy's config and data dirs in the temp dir: nothing in $HOME.
	b.env = append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"))

	// Generator.
	switch b.o.generator {
	case "wrk", "auto":
		if p, err := exec.LookPath("wrk"); err == nil {
			b.wrk = p
			b.genDesc = wrkVersion(p) + fmt.Sprintf(" (%d threads, Lua script sets X-Key and counts statuses)", min(runtime.NumCPU(), b.o.conns))
		} else if b.o.generator == "wrk" {
			return errors.New("-generator wrk: wrk not found on PATH")
		}
	}
	if b.wrk == "" {
		b.genDesc = "go (built in: raw HTTP/1.1 keep-alive connections, one goroutine each, in the bench process)"
	}

	// Refuse early, before the build, when a site needs Redis and there is none.
	needRedis := slices.ContainsFunc(sites, func(s site) bool { return s.Redis })
	if needRedis {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return errRedisMissing
		}
	}

	// Caddy.
	goBin, err := exec.LookPath("go")
	if err != nil && b.o.caddyBin == "" {
		return errors.New("go not found on PATH (needed to build ./cmd/caddy)")
	}
	if b.o.caddyBin != "" {
		if b.caddyBin, err = filepath.Abs(b.o.caddyBin); err != nil {
			return err
		}
	} else {
		root, err := moduleRoot(goBin)
		if err != nil {
			return err
		}
		logf("building Caddy (go build ./cmd/caddy) in %s", root)
		t := time.Now()
		if b.caddyBin, err = buildCaddy(ctx, goBin, root, dir); err != nil {
			return err
		}
		logf("built in %v", time.Since(t).Round(100*time.Millisecond))
	}

	// Redis, if a site uses it.
	redisURL := "redis://127.0.0.1:1" // never dialled when no site uses Redis
	if needRedis {
		if b.redis, err = startRedis(ctx, dir); err != nil {
			return err
		}
		redisURL = "redis://" + b.redis.addr
		logf("redis-server on %s", b.redis.addr)
	}

	// Config.
	sites, skipped, cfgPath, ports, err := b.config(sites, redisURL)
	if err != nil {
		return err
	}

	// Caddy run.
	caddy, err := startProc("caddy", filepath.Join(dir, "caddy.log"), dir, b.env, b.caddyBin,
		"run", "--config", cfgPath, "--adapter", "caddyfile")
	if err != nil {
		return err
	}
	b.caddyLog = caddy.log
	urls := map[string]string{}
	for _, s := range sites {
		urls[s.Name] = fmt.Sprintf("http://127.0.0.1:%d/", ports[s.Name])
	}
	if err := waitSites(ctx, caddy, urls); err != nil {
		return err
	}
	logf("caddy up (%s); generator: %s", cfgPath, b.genDesc)

	// Load, one site at a time; with -rounds, the whole sequence again, so
	// a change in background load hits every site alike.
	rounds := map[string][]measurement{}
	for round := 1; round <= b.o.rounds; round++ {
		for _, s := range sites {
			m, err := b.measure(s, ports[s.Name])
			if err != nil {
				return fmt.Errorf("site %s: %w", s.Name, err)
			}
			if caddy.exited() {
				return fmt.Errorf("caddy exited during the %s run\n%s", s.Name, logTail(caddy.log, 30))
			}
			rounds[s.Name] = append(rounds[s.Name], m)
			tag := ""
			if b.o.rounds > 1 {
				tag = fmt.Sprintf("[%d/%d] ", round, b.o.rounds)
			}
			logf("%s%-18s %8.0f req/s  p50 %s  p99 %s  2xx %d  429 %d  errors %d%s",
				tag, s.Name, m.ReqPerSec, fmtMs(m.P50), fmtMs(m.P99), m.S2xx, m.S429, m.Errors+m.SOther, lastErr(m))
		}
	}
	results := map[string]measurement{}
	for name, ms := range rounds {
		m := medianRun(ms)
		m.CaddyErrors, m.CaddyError = 0, ""
		for _, r := range ms { // Caddy's errors of every round
			m.CaddyErrors += r.CaddyErrors
			m.CaddyError = cmp.Or(m.CaddyError, r.CaddyError)
		}
		results[name] = m
	}

	// Half load.
	var half *halfLoad
	_, haveNone := results["none"]
	_, haveRedis := results["redis_log"]
	switch {
	case !b.o.halfLoad:
	case !haveNone || !haveRedis:
		logf("half-load measurement skipped: it needs sites none and redis_log")
	default:
		// Half of the limiter's own max: at half of none's, a Redis site
		// is saturated and its p99 is queueing, not the limiter's cost.
		rate := results["redis_log"].ReqPerSec / 2
		if b.o.halfRate > 0 {
			rate = b.o.halfRate
		}
		half, err = b.halfLoad(rate, ports)
		if err != nil {
			return err
		}
	}

	rep := buildReport(b, sites, skipped, results, half)
	printReport(os.Stdout, rep)
	if b.o.jsonPath != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(b.o.jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
		logf("wrote %s", b.o.jsonPath)
	}
	return nil
}

// medianRun returns the run with the median req/s (the lower middle one for
// an even count), keeping p50/p99 and counts of one real run together.
func medianRun(ms []measurement) measurement {
	s := slices.Clone(ms)
	slices.SortFunc(s, func(a, b measurement) int { return cmp.Compare(a.ReqPerSec, b.ReqPerSec) })
	return s[(len(s)-1)/2]
}

func lastErr(m measurement) string {
	if m.LastErr == "" {
		return ""
	}
	return " (last error: " + m.LastErr + ")"
}

// config writes and validates the Caddyfile. When Caddy rejects it, each
// site is validated alone to name the culprits: they are skipped with
// -skip-unsupported, otherwise the run stops with Caddy's message.
func (b *bench) config(sites []site, redisURL string) (kept []site, skipped map[string]string, path string, ports map[string]int, err error) {
	pl, err := freePorts(len(sites) + 1)
	if err != nil {
		return nil, nil, "", nil, err
	}
	adminPort := pl[0]
	ports = map[string]int{}
	for i, s := range sites {
		ports[s.Name] = pl[i+1]
	}
	path = filepath.Join(b.dir, "Caddyfile")
	write := func(p string, ss []site) error {
		return os.WriteFile(p, []byte(caddyfile(adminPort, ss, ports, redisURL)), 0o644)
	}
	if err := write(path, sites); err != nil {
		return nil, nil, "", nil, err
	}
	allErr := validateCaddyfile(b.ctx, b.caddyBin, path, b.env)
	if allErr == nil {
		return sites, nil, path, ports, nil
	}
	if b.ctx.Err() != nil {
		return nil, nil, "", nil, b.ctx.Err()
	}

	skipped = map[string]string{}
	for _, s := range sites {
		p := filepath.Join(b.dir, "Caddyfile."+s.Name)
		if err := write(p, []site{s}); err != nil {
			return nil, nil, "", nil, err
		}
		if err := validateCaddyfile(b.ctx, b.caddyBin, p, b.env); err != nil {
			skipped[s.Name] = err.Error()
		} else {
			kept = append(kept, s)
		}
	}
	if len(skipped) == 0 {
		return nil, nil, "", nil, fmt.Errorf("caddy rejects the benchmark Caddyfile %s (every site alone is fine):\n  %v", path, allErr)
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "this Caddy build rejects the config of %d site(s):\n", len(skipped))
	for _, s := range sites {
		if e, ok := skipped[s.Name]; ok {
			need := ""
			if s.Needs != "" {
				need = " (the site needs " + s.Needs + ")"
			}
			fmt.Fprintf(&msg, "  %s%s:\n    %s\n", s.Name, need, e)
		}
	}
	if !b.o.skipUnsupported {
		var names []string
		for _, s := range kept {
			names = append(names, s.Name)
		}
		fmt.Fprintf(&msg, "A feature the site needs is not in this build (not merged yet?). Run without it:\n"+
			"  go run ./cmd/bench -sites %s\nor add -skip-unsupported to skip such sites.", strings.Join(names, ","))
		return nil, nil, "", nil, errors.New(msg.String())
	}
	logf("%sskipping them (-skip-unsupported)", msg.String())
	if len(kept) == 0 {
		return nil, nil, "", nil, errors.New("no site left to run")
	}
	if err := write(path, kept); err != nil {
		return nil, nil, "", nil, err
	}
	if err := validateCaddyfile(b.ctx, b.caddyBin, path, b.env); err != nil {
		return nil, nil, "", nil, fmt.Errorf("caddy rejects %s: %v", path, err)
	}
	return kept, skipped, path, ports, nil
}

func (b *bench) spec(s site, port int) loadSpec {
	spec := loadSpec{
		Addr: fmt.Sprintf("127.0.0.1:%d", port), Keys: b.o.keys, Conns: b.o.conns,
		Warmup: b.o.warmup, Duration: b.o.duration,
	}
	if s.Hot {
		spec.HotKey = hotKeyFor(s)
	}
	return spec
}

// measure drives one site at full speed (closed loop).
func (b *bench) measure(s site, port int) (measurement, error) {
	ctx := b.ctx
	settle()
	spec := b.spec(s, port)
	errsBefore, _ := caddyLogErrors(b.caddyLog)
	var before int64 = -1
	snapshot := func() {
		if b.redis == nil {
			return
		}
		n, err := scriptCalls(ctx, b.redis.client)
		if err != nil {
			logf("INFO commandstats: %v", err)
			return
		}
		before = n
	}
	var m measurement
	if b.wrk != "" {
		url := fmt.Sprintf("http://%s/", spec.Addr)
		threads := runtime.NumCPU()
		if spec.Warmup > 0 {
			if _, err := runWrk(ctx, b.wrk, b.dir, url, spec, threads, spec.Warmup); err != nil {
				return m, fmt.Errorf("warm-up: %w", err)
			}
		}
		snapshot()
		var err error
		if m, err = runWrk(ctx, b.wrk, b.dir, url, spec, threads, spec.Duration); err != nil {
			return m, err
		}
		m.RedisCalls = -1
	} else {
		spec.OnMeasure = snapshot
		r := runGoLoad(ctx, spec)
		m = fromLoad(&r)
	}
	if ctx.Err() != nil {
		return m, ctx.Err()
	}
	if b.redis != nil && before >= 0 {
		if after, err := scriptCalls(ctx, b.redis.client); err == nil {
			m.RedisCalls = after - before
		}
	}
	if n, _ := caddyLogErrors(b.caddyLog); n > errsBefore {
		m.CaddyErrors = n - errsBefore
		m.CaddyError = nthCaddyError(b.caddyLog, errsBefore)
	}
	return m, nil
}

// settle lets the previous run's connections close and collects garbage, so
// one site's run does not tax the next.
func settle() {
	runtime.GC()
	time.Sleep(300 * time.Millisecond)
}

// halfLoad is the open-loop measurement at a fixed rate.
type halfLoad struct {
	Rate  float64
	Sites []halfLoadSite
}

type halfLoadSite struct {
	Name      string
	Achieved  float64
	P50, P99  time.Duration
	SchedP99  time.Duration // from the scheduled send time (wrk2-style)
	Errors    uint64
	Non2xx    uint64
	Responses uint64
}

// halfLoad runs none and redis_log at rate req/s, open loop, with the Go
// generator (wrk cannot pace; wrk2 is rarely installed).
func (b *bench) halfLoad(rate float64, ports map[string]int) (*halfLoad, error) {
	h := &halfLoad{Rate: rate}
	for _, name := range []string{"none", "redis_log"} {
		var s site
		for _, x := range allSites {
			if x.Name == name {
				s = x
			}
		}
		settle()
		spec := b.spec(s, ports[name])
		spec.Rate = rate
		r := runGoLoad(b.ctx, spec)
		if b.ctx.Err() != nil {
			return nil, b.ctx.Err()
		}
		hs := halfLoadSite{
			Name: name, Achieved: r.reqPerSec(),
			P50: r.Latency.quantile(0.5), P99: r.Latency.quantile(0.99), SchedP99: r.Sched.quantile(0.99),
			Errors: r.Errors, Non2xx: r.S429 + r.SOther, Responses: r.Responses,
		}
		logf("half load %-10s %8.0f req/s (target %.0f)  p50 %s  p99 %s  p99 from schedule %s",
			name, hs.Achieved, rate, fmtMs(hs.P50), fmtMs(hs.P99), fmtMs(hs.SchedP99))
		h.Sites = append(h.Sites, hs)
	}
	return h, nil
}

func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}
