// Command bench is sliding_ratelimit's end-to-end benchmark. It builds this
// repository's Caddy, starts its own redis-server on a free loopback port,
// runs one Caddy with one site per case (no limiter, in-process, Redis per
// algorithm and set size, a hot key over its limit with and without the
// deny cache), and drives the sites with an HTTP load generator on
// 127.0.0.1 (wrk if installed, else a built-in Go generator).
//
// The machine's speed drifts within seconds, so no site is compared with a
// run of the bare Caddy minutes apart: each site is measured in short pairs
// with the bare Caddy (-pairs of -pair-duration each, alternating which
// goes first), and the table gives the median of the paired ratios with
// their range. It does so in two layouts: shared (every process on every
// CPU) and pinned (Caddy alone on CPU 0 with GOMAXPROCS=1, the load
// generator and redis-server on CPU 1), and reports per site Caddy's CPU
// time per request (/proc/PID/stat), Redis's CPU time per request and per
// script call (INFO cpu and commandstats) against a trivial EVAL measured
// in the same run, then the p99 latency the Redis limiter adds at half load
// and the allocs/op of the handler micro-benchmark. docs/bench.md explains
// the columns.
//
//	go run ./cmd/bench                          # every site, both layouts, 7 pairs of 2s
//	go run ./cmd/bench -quick                   # smoke test: 1 pair of 300ms, no micro-benchmark
//	go run ./cmd/bench -layouts pinned -sites none,redis_log,redis_log_10000 -pairs 9
//	go run ./cmd/bench -harness outside -sites none,memory_log   # issue 29's outside harness alone
//	go run ./cmd/bench -layouts pinned -harness sweep -sites none,memory_log,peer_memory -peer DIR
//
// Each layout runs in the bench harness setting (-conns, -admin,
// -log-level, -rate), and the pinned layout once more in the outside one
// (issue 29's: 32 connections, admin off, log level ERROR, many-key limits
// 100 a second); with both, the report ends with the sites' ratios in each,
// side by side.
//
// It needs redis-server on PATH (unless no selected site uses Redis) and
// sends traffic only to 127.0.0.1; every process it starts is stopped on
// exit, Ctrl-C included.
package main

import (
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

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

func init() {
	// Children are started from main; Pdeathsig (see procs.Attr) fires when
	// the thread that started them exits, so keep main on one thread.
	runtime.LockOSThread()
}

type options struct {
	pairs           int
	pairDuration    time.Duration
	warmup          time.Duration
	fillMax         time.Duration
	conns, keys     int
	sites, layouts  string
	harnesses       string
	admin           bool
	logLevel        string
	rate            string
	keep            bool
	jsonPath        string
	plotPath        string
	replot          string
	generator       string
	halfLoad        bool
	halfRate        float64
	halfDuration    time.Duration
	skipUnsupported bool
	caddyBin        string
	peer            string
	micro           bool
	microBenchtime  string
	quick           bool
}

// quickDefaults are what -quick sets, for every flag not given explicitly.
var quickDefaults = map[string]string{
	"pairs": "1", "pair-duration": "300ms", "warmup": "200ms", "fill-max": "2s",
	"half-duration": "500ms", "micro": "false",
}

func main() {
	os.Exit(run())
}

func run() (code int) {
	defer cleanup.Run()

	var o options
	flag.IntVar(&o.pairs, "pairs", 7, "pairs (site run, bare Caddy run) per site and layout")
	flag.DurationVar(&o.pairDuration, "pair-duration", 2*time.Second, "measured load of each run of a pair")
	flag.IntVar(&o.pairs, "rounds", 7, "deprecated: same as -pairs")
	flag.DurationVar(&o.pairDuration, "duration", 2*time.Second, "deprecated: same as -pair-duration")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load on each site (and on the bare Caddy) before its pairs")
	flag.DurationVar(&o.fillMax, "fill-max", 30*time.Second, "longest load that brings the at-limit sites (redis_log_100, redis_log_10000) to their limit")
	flag.IntVar(&o.conns, "conns", 64, "concurrent keep-alive connections")
	flag.IntVar(&o.keys, "keys", 100000, "distinct X-Key values for the many-key sites (hot_* sites use one key, the at-limit sites 10)")
	flag.StringVar(&o.sites, "sites", "all", "comma-separated sites to run: "+strings.Join(siteNames(), ","))
	flag.StringVar(&o.layouts, "layouts", "shared,pinned", "comma-separated CPU layouts: shared, pinned (or all)")
	flag.StringVar(&o.harnesses, "harness", "bench,outside", "comma-separated harness settings: bench (this benchmark's: -conns, -admin, -log-level, -rate, in each of -layouts), outside (issue 29's: pinned, 32 connections, admin off, log level ERROR, many-key limits 100/1s), or one of outside's choices alone on bench's, pinned: conns32, quiet (admin off, ERROR), rate100; all = bench,outside; sweep = every one")
	flag.BoolVar(&o.admin, "admin", true, "bench setting: Caddy's admin endpoint on (false: admin off)")
	flag.StringVar(&o.logLevel, "log-level", "", "bench setting: Caddy's default log level (DEBUG, INFO, WARN, ERROR; empty: Caddy's default, INFO)")
	flag.StringVar(&o.rate, "rate", "", "bench setting: the limit and window of our many-key sites, LIMIT/WINDOW (as 100/1s; empty: each site's own, 10000 or 10^9 a minute)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (Caddyfile, logs, binary)")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.plotPath, "plot", "", "also draw each site's ratio to bare Caddy (median and min–max of the pairs, per layout, the peer's beside ours) into this PNG file")
	flag.StringVar(&o.replot, "replot", "", "with -plot: draw the plot of an earlier run from its -json file, and run nothing")
	flag.StringVar(&o.generator, "generator", "auto", "load generator: auto (wrk if on PATH, else go), wrk or go")
	flag.BoolVar(&o.halfLoad, "halfload", true, "measure p99 of none and redis_log at half of redis_log's max rate, per layout (needs redis_log)")
	flag.Float64Var(&o.halfRate, "half-rate", 0, "rate (req/s) of the half-load measurement; 0 means half of redis_log's median")
	flag.DurationVar(&o.halfDuration, "half-duration", 5*time.Second, "measured load per site of the half-load measurement")
	flag.BoolVar(&o.skipUnsupported, "skip-unsupported", false, "skip sites whose config this Caddy build rejects, instead of failing")
	flag.StringVar(&o.caddyBin, "caddy", "", "use this Caddy binary instead of building ./cmd/caddy (it must include the plugin)")
	flag.StringVar(&o.peer, "peer", os.Getenv("PEER_SRC"), "a local clone of github.com/mholt/caddy-ratelimit (default $PEER_SRC): build one Caddy with both plugins (a scratch module in the temp dir) and measure the peer's sites too")
	flag.BoolVar(&o.micro, "micro", true, "also run the handler micro-benchmark (go test -bench "+microBenchName+" -benchmem) for allocs/op")
	flag.StringVar(&o.microBenchtime, "micro-benchtime", "2000x", "-benchtime of the micro-benchmark")
	flag.BoolVar(&o.quick, "quick", false, "smoke test: -pairs 1 -pair-duration 300ms -warmup 200ms -fill-max 2s -half-duration 500ms -micro=false (flags given explicitly win)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./cmd/bench [flags]\n\n"+
			"End-to-end benchmark: builds ./cmd/caddy, starts its own redis-server and one Caddy with one site\n"+
			"per case, measures each site in short pairs with the bare Caddy, in a shared and a pinned CPU\n"+
			"layout, and prints markdown tables (see docs/bench.md).\n\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if o.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range quickDefaults {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
	}
	if o.replot != "" {
		if err := replot(o.replot, o.plotPath); err != nil {
			return fail(err)
		}
		return 0
	}
	if err := o.check(); err != nil {
		return fail(err)
	}
	if o.peer != "" && o.caddyBin != "" {
		return fail(errors.New("-peer builds its own Caddy: give -peer or -caddy, not both"))
	}
	sites, err := selectSites(o.sites, o.peer != "")
	if err != nil {
		return fail(err)
	}
	layouts, layoutNote, err := selectLayouts(o.layouts)
	if err != nil {
		return fail(err)
	}
	harnesses, err := selectHarnesses(o.harnesses, &o)
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

	b := &bench{o: o, ctx: ctx, loadAvg: procs.LoadAvg(), layoutNote: layoutNote}
	if n := runtime.NumCPU(); b.loadAvg > 0.5*float64(n) {
		logf("warning: load average %.2f on %d CPUs before the run: other processes compete for the CPUs, results will be low and noisy", b.loadAvg, n)
	}
	if layoutNote != "" {
		logf("%s", layoutNote)
	}
	if err := b.run(sites, layouts, harnesses); err != nil {
		if ctx.Err() != nil {
			return 130
		}
		return fail(err)
	}
	return 0
}

func (o *options) check() error {
	if o.pairs <= 0 || o.pairDuration <= 0 || o.conns <= 0 || o.keys <= 0 || o.halfDuration <= 0 {
		return errors.New("-pairs, -pair-duration, -conns, -keys and -half-duration must be positive")
	}
	if o.warmup < 0 || o.fillMax < 0 || o.halfRate < 0 {
		return errors.New("-warmup, -fill-max and -half-rate must not be negative")
	}
	if o.rate != "" {
		if _, _, err := parseRate(o.rate); err != nil {
			return err
		}
	}
	switch o.logLevel {
	case "", "DEBUG", "INFO", "WARN", "ERROR":
	default:
		return fmt.Errorf("-log-level must be DEBUG, INFO, WARN or ERROR, got %q", o.logLevel)
	}
	switch o.generator {
	case "auto", "go", "wrk":
	default:
		return fmt.Errorf("-generator must be auto, go or wrk, got %q", o.generator)
	}
	return nil
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	return 1
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// measurement is one load run's result, whatever the generator.
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
	// CaddyErrors is how many error lines Caddy logged during the run,
	// CaddyError the first of them.
	CaddyErrors int
	CaddyError  string
}

func fromLoad(r *loadResult) measurement {
	return measurement{
		Generator: r.Generator, ReqPerSec: r.reqPerSec(),
		P50: r.Latency.quantile(0.50), P99: r.Latency.quantile(0.99),
		Responses: r.Responses, S2xx: r.S2xx, S429: r.S429, SOther: r.SOther, Errors: r.Errors,
		Elapsed: r.Elapsed, LastErr: r.LastErr,
	}
}

type bench struct {
	o   options
	ctx context.Context

	dir        string
	caddyBin   string
	goBin      string
	root       string // module root ("" with -caddy and no go)
	env        []string
	wrk        string // wrk path, "" for the Go generator
	loadAvg    float64
	genDesc    string
	layoutNote string
	redisUsed  bool

	// Decided by the first layout: the sites this Caddy accepts.
	sites     []site
	skipped   map[string]string
	validated bool
}

// layoutResult is one layout's pass over the sites, in one harness
// setting.
type layoutResult struct {
	Layout     layout
	Harness    harness
	Sites      []siteResult
	Trivial    *trivial
	TrivialErr string
	Half       *halfLoad
	Verified   string // how the pinning was checked
}

// siteResult is one site's pairs in one layout.
type siteResult struct {
	Site  site
	Pairs []pair
	Fill  *fillResult
}

// fillResult is how the at-limit site's fill went.
type fillResult struct {
	Elapsed   time.Duration
	Responses uint64
	Share429  float64 // of the last second of the fill
	Reached   bool
}

func (b *bench) run(sites []site, layouts []layout, harnesses []harness) error {
	ctx := b.ctx
	dir, err := os.MkdirTemp("", "sliding-ratelimit-bench-")
	if err != nil {
		return err
	}
	b.dir = dir
	if b.o.keep {
		logf("keeping %s", dir)
	} else {
		cleanup.Add(func() { _ = os.RemoveAll(dir) })
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
			b.genDesc = wrkVersion(p) + " (one thread per CPU it may use, Lua script sets X-Key and counts statuses)"
		} else if b.o.generator == "wrk" {
			return errors.New("-generator wrk: wrk not found on PATH")
		}
	}
	if b.wrk == "" {
		b.genDesc = "go (built in: raw HTTP/1.1 keep-alive connections, one goroutine each, in the bench process)"
	}

	// Refuse early, before the build, when a site needs Redis and there is none.
	b.redisUsed = slices.ContainsFunc(sites, func(s site) bool { return s.Redis })
	if b.redisUsed {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return errRedisMissing
		}
	}

	// Caddy.
	b.goBin, _ = exec.LookPath("go")
	if b.goBin != "" {
		if b.root, err = moduleRoot(b.goBin); err != nil && b.o.caddyBin == "" {
			return err
		}
	}
	if b.o.caddyBin != "" {
		if b.caddyBin, err = filepath.Abs(b.o.caddyBin); err != nil {
			return err
		}
	} else {
		if b.goBin == "" {
			return errors.New("go not found on PATH (needed to build ./cmd/caddy)")
		}
		t := time.Now()
		if b.o.peer != "" {
			logf("building Caddy with this plugin and the peer from %s (a scratch module in %s)", b.o.peer, dir)
			b.caddyBin, err = buildWithPeer(ctx, b.goBin, b.root, b.o.peer, dir)
		} else {
			logf("building Caddy (go build ./cmd/caddy) in %s", b.root)
			b.caddyBin, err = buildCaddy(ctx, b.goBin, b.root, dir)
		}
		if err != nil {
			return err
		}
		logf("built in %v", time.Since(t).Round(100*time.Millisecond))
	}

	var results []*layoutResult
	for _, h := range harnesses {
		ls := layouts
		if h.PinnedOnly {
			p, err := pinnedLayout()
			if err != nil {
				logf("harness %s skipped: it runs pinned, and the pinned layout is unavailable: %v", h.Name, err)
				continue
			}
			ls = []layout{p}
		}
		for _, l := range ls {
			r, err := b.runLayout(h, l, sites)
			if err != nil {
				return fmt.Errorf("%s layout, harness %s: %w", l.Name, h.Name, err)
			}
			results = append(results, r)
		}
	}

	var micro *microResult
	if b.o.micro {
		logf("micro-benchmark: go test -bench %s -benchmem -benchtime %s (in %s)", microBenchName, b.o.microBenchtime, b.root)
		micro = runMicro(ctx, b.goBin, b.root, b.o.microBenchtime)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if micro.Err != "" {
			logf("micro-benchmark: allocs/op n/a: %s", micro.Err)
		}
	}

	rep := buildReport(b, results, micro)
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
	if b.o.plotPath != "" {
		if err := writePlot(b.o.plotPath, rep); err != nil {
			return err
		}
		logf("wrote %s", b.o.plotPath)
	}
	return nil
}

// layoutRun is what one layout's pass has running.
type layoutRun struct {
	l      layout
	h      harness
	redis  *redistest.Proc
	client *redis.Client
	caddy  *procs.Proc
	ports  map[string]int
}

// runLayout starts redis-server and Caddy placed as l says, measures every
// site in pairs with the bare Caddy, and stops them.
func (b *bench) runLayout(h harness, l layout, sites []site) (res *layoutResult, err error) {
	ctx := b.ctx
	logf("=== %s layout, harness %s (%s): %s", l.Name, h.Name, h.describe(), l.describe(runtime.NumCPU()))
	res = &layoutResult{Layout: l, Harness: h}
	lr := &layoutRun{l: l, h: h}

	// Redis, if a site uses it.
	redisURL := "redis://127.0.0.1:1" // never dialled when no site uses Redis
	if b.redisUsed {
		lr.redis, err = redistest.Launch(redistest.LaunchOptions{
			Dir: b.dir, Wrapper: wrap(l.LoadCPU), Args: []string{"--protected-mode", "yes"},
		})
		if err != nil {
			return nil, err
		}
		cleanup.Add(lr.redis.Stop)
		defer lr.redis.Stop()
		lr.client = redis.NewClient(&redis.Options{Addr: lr.redis.Addr(), DialTimeout: time.Second, MaxRetries: -1})
		defer lr.client.Close()
		redisURL = "redis://" + lr.redis.Addr()
		logf("redis-server on %s (pid %d)", lr.redis.Addr(), lr.redis.Pid())
	}

	// Config: the first layout finds the sites this Caddy accepts.
	if !b.validated {
		if b.sites, b.skipped, err = b.validateSites(sites, redisURL); err != nil {
			return nil, err
		}
		b.validated = true
	}
	cfgPath, ports, err := b.writeConfigFor(h, withBare(b.sites), redisURL, h.Name+"-"+l.Name)
	if err != nil {
		return nil, err
	}
	lr.ports = ports

	// Caddy.
	env := b.env
	bin, args := b.caddyBin, []string{"run", "--config", cfgPath, "--adapter", "caddyfile"}
	if l.pinned() {
		env = append(slices.Clone(env), "GOMAXPROCS=1")
		w := wrap(l.CaddyCPU)
		if bin, err = exec.LookPath(w[0]); err != nil {
			return nil, err
		}
		args = append(append(w[1:], b.caddyBin), args...)
	}
	lr.caddy, err = procs.Start(&cleanup, "caddy", filepath.Join(b.dir, "caddy-"+h.Name+"-"+l.Name+".log"), b.dir, env, bin, args...)
	if err != nil {
		return nil, err
	}
	defer lr.caddy.Stop()
	urls := map[string]string{}
	for name, port := range ports {
		urls[name] = fmt.Sprintf("http://127.0.0.1:%d/", port)
	}
	if err := waitSites(ctx, lr.caddy, urls); err != nil {
		return nil, err
	}
	logf("caddy up (%s, pid %d); generator: %s", cfgPath, lr.caddy.Pid(), b.genDesc)

	if l.pinned() {
		checks := []error{checkAffinity("caddy", lr.caddy.Pid(), []int{l.CaddyCPU})}
		if lr.redis != nil {
			checks = append(checks, checkAffinity("redis-server", lr.redis.Pid(), []int{l.LoadCPU}))
		}
		if err := errors.Join(checks...); err != nil {
			return nil, fmt.Errorf("pinning did not take: %w", err)
		}
		// The bench process itself (the Go generator, the half-load run,
		// the INFO reads) goes to the load CPU too.
		restore, err := pinSelf(l.LoadCPU)
		if err != nil {
			return nil, fmt.Errorf("pinning the load generator: %w", err)
		}
		defer restore()
		if err := checkAffinity("bench (load generator)", os.Getpid(), []int{l.LoadCPU}); err != nil {
			return nil, err
		}
		res.Verified = fmt.Sprintf("checked in /proc/PID/status: caddy on CPU %d, redis-server and load generator on CPU %d", l.CaddyCPU, l.LoadCPU)
	}

	// The trivial-script baseline, on the same server, before the load.
	if lr.client != nil {
		res.Trivial, err = trivialEval(ctx, lr.client, 50000, 50)
		if err != nil {
			res.TrivialErr = err.Error()
			logf("trivial EVAL baseline: %v", err)
		} else {
			logf("trivial EVAL \"return 1\" 0: %.2f µs/call (commandstats), %.2f µs Redis CPU/call (pipelined %d deep, %d calls)",
				res.Trivial.UsecPerCall, us(res.Trivial.CPUPerCall), res.Trivial.Pipeline, res.Trivial.Calls)
		}
	}

	// The bare Caddy warms up once; each site before its pairs.
	bare := siteByName(bareSite)
	if err := b.warm(lr, bare); err != nil {
		return nil, err
	}
	for _, s := range b.sites {
		sr, err := b.measureSite(lr, s, bare)
		if err != nil {
			return nil, fmt.Errorf("site %s: %w", s.Name, err)
		}
		res.Sites = append(res.Sites, *sr)
	}

	// Half load.
	var redisLog *siteResult
	for i := range res.Sites {
		if res.Sites[i].Site.Name == "redis_log" {
			redisLog = &res.Sites[i]
		}
	}
	switch {
	case !b.o.halfLoad:
	case redisLog == nil:
		logf("half-load measurement skipped: it needs site redis_log")
	default:
		// Half of the limiter's own max: at half of none's, a Redis site
		// is saturated and its p99 is queueing, not the limiter's cost.
		rate := summarize(redisLog.Pairs).ReqPerSec / 2
		if b.o.halfRate > 0 {
			rate = b.o.halfRate
		}
		if res.Half, err = b.halfLoad(lr, rate); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// measureSite warms a site up (and fills it if it is an at-limit one), then
// measures it in pairs with the bare Caddy, alternating which goes first.
func (b *bench) measureSite(lr *layoutRun, s, bare site) (*siteResult, error) {
	sr := &siteResult{Site: s}
	if s.Name != bareSite {
		if err := b.warm(lr, s); err != nil {
			return nil, err
		}
	}
	if s.Fill {
		f, err := b.fill(lr, s)
		if err != nil {
			return nil, err
		}
		sr.Fill = f
	}
	for i := range b.o.pairs {
		var p pair
		p.SiteFirst = i%2 == 1
		order := []struct {
			s   site
			dst *sample
		}{{bare, &p.Bare}, {s, &p.Site}}
		if p.SiteFirst {
			order[0], order[1] = order[1], order[0]
		}
		for _, o := range order {
			smp, err := b.sample(lr, o.s, b.o.pairDuration)
			if err != nil {
				return nil, err
			}
			*o.dst = smp
		}
		sr.Pairs = append(sr.Pairs, p)
		ratio, _ := p.ratio()
		logf("[%s] %-18s pair %d/%d: %8.0f req/s vs bare %8.0f (ratio %.3f)  p99 %s  2xx %d  429 %d  errors %d%s",
			lr.l.Name, s.Name, i+1, b.o.pairs, p.Site.ReqPerSec, p.Bare.ReqPerSec, ratio, fmtMs(p.Site.P99),
			p.Site.S2xx, p.Site.S429, p.Site.Errors+p.Site.SOther, lastErr(p.Site.measurement))
	}
	return sr, nil
}

// warm drives a site for -warmup, unmeasured.
func (b *bench) warm(lr *layoutRun, s site) error {
	if b.o.warmup <= 0 {
		return nil
	}
	_, err := b.drive(lr, s, b.o.warmup)
	return err
}

// fill drives an at-limit site in 1s steps until most of a step's responses
// are 429 (its keys hold sets of their limit), or -fill-max has passed.
func (b *bench) fill(lr *layoutRun, s site) (*fillResult, error) {
	f := &fillResult{}
	start := time.Now()
	for f.Elapsed < b.o.fillMax {
		step := min(time.Second, b.o.fillMax-f.Elapsed)
		m, err := b.drive(lr, s, step)
		if err != nil {
			return nil, err
		}
		f.Elapsed = time.Since(start)
		f.Responses += m.Responses
		if m.Responses > 0 {
			f.Share429 = float64(m.S429) / float64(m.Responses)
		}
		if f.Share429 >= 0.5 {
			f.Reached = true
			break
		}
	}
	state := "its keys are at their limit"
	if !f.Reached {
		state = "NOT at the limit yet (raise -fill-max): its sets are smaller than the limit"
	}
	logf("[%s] %s filled for %v (%d responses, last step %.0f%% 429): %s",
		lr.l.Name, s.Name, f.Elapsed.Round(100*time.Millisecond), f.Responses, 100*f.Share429, state)
	return f, nil
}

// sample drives a site for d, measured, with Caddy's and Redis's counters
// read around the run.
func (b *bench) sample(lr *layoutRun, s site, d time.Duration) (sample, error) {
	settle()
	errsBefore, _ := caddyLogErrors(lr.caddy.Log)
	before := snap(b.ctx, lr.caddy.Pid(), lr.client)
	m, err := b.drive(lr, s, d)
	after := snap(b.ctx, lr.caddy.Pid(), lr.client)
	if err != nil {
		return sample{}, err
	}
	smp := sample{measurement: m}
	smp.fill(before, after)
	if n, _ := caddyLogErrors(lr.caddy.Log); n > errsBefore {
		smp.CaddyErrors = n - errsBefore
		smp.CaddyError = nthCaddyError(lr.caddy.Log, errsBefore)
	}
	return smp, nil
}

// drive runs the load generator against a site for d (closed loop).
func (b *bench) drive(lr *layoutRun, s site, d time.Duration) (measurement, error) {
	ctx := b.ctx
	spec := b.spec(lr, s)
	spec.Duration = d
	var m measurement
	if b.wrk != "" {
		threads := runtime.NumCPU()
		if lr.l.pinned() {
			threads = 1
		}
		var err error
		m, err = runWrk(ctx, wrap(lr.l.LoadCPU), b.wrk, b.dir, fmt.Sprintf("http://%s/", spec.Addr), spec, threads, d)
		if err != nil {
			return m, err
		}
	} else {
		r := runGoLoad(ctx, spec)
		m = fromLoad(&r)
	}
	if ctx.Err() != nil {
		return m, ctx.Err()
	}
	if lr.caddy.Exited() {
		return m, fmt.Errorf("caddy exited during the %s run\n%s", s.Name, lr.caddy.LogTail(30))
	}
	if lr.redis != nil && s.Redis && lr.redis.Exited() {
		return m, fmt.Errorf("redis-server exited during the %s run\n%s", s.Name, lr.redis.LogTail())
	}
	return m, nil
}

// validateSites validates the Caddyfile of every site (and the bare one).
// When Caddy rejects it, each site is validated alone to name the culprits:
// they are skipped with -skip-unsupported, otherwise the run stops with
// Caddy's message.
func (b *bench) validateSites(sites []site, redisURL string) (kept []site, skipped map[string]string, err error) {
	path, _, err := b.writeConfig(withBare(sites), redisURL, "validate")
	if err != nil {
		return nil, nil, err
	}
	allErr := validateCaddyfile(b.ctx, b.caddyBin, path, b.env)
	if allErr == nil {
		return sites, nil, nil
	}
	if b.ctx.Err() != nil {
		return nil, nil, b.ctx.Err()
	}

	skipped = map[string]string{}
	for _, s := range withBare(sites) {
		p, _, err := b.writeConfig([]site{s}, redisURL, "validate-"+s.Name)
		if err != nil {
			return nil, nil, err
		}
		if err := validateCaddyfile(b.ctx, b.caddyBin, p, b.env); err != nil {
			if s.Name == bareSite {
				return nil, nil, fmt.Errorf("caddy rejects even the site without a limiter: %v", err)
			}
			skipped[s.Name] = err.Error()
		} else if slices.ContainsFunc(sites, func(x site) bool { return x.Name == s.Name }) {
			kept = append(kept, s)
		}
	}
	if len(skipped) == 0 {
		return nil, nil, fmt.Errorf("caddy rejects the benchmark Caddyfile %s (every site alone is fine):\n  %v", path, allErr)
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
		return nil, nil, errors.New(msg.String())
	}
	logf("%sskipping them (-skip-unsupported)", msg.String())
	if len(kept) == 0 {
		return nil, nil, errors.New("no site left to run")
	}
	path, _, err = b.writeConfig(withBare(kept), redisURL, "validate")
	if err != nil {
		return nil, nil, err
	}
	if err := validateCaddyfile(b.ctx, b.caddyBin, path, b.env); err != nil {
		return nil, nil, fmt.Errorf("caddy rejects %s: %v", path, err)
	}
	return kept, skipped, nil
}

// writeConfig writes the Caddyfile of sites, each on a fresh free port, as
// Caddyfile.<tag> in the temp dir, in the bench harness setting.
func (b *bench) writeConfig(sites []site, redisURL, tag string) (path string, ports map[string]int, err error) {
	return b.writeConfigFor(benchHarness(&b.o), sites, redisURL, tag)
}

// writeConfigFor is writeConfig in harness setting h (its admin, log level
// and many-key rate).
func (b *bench) writeConfigFor(h harness, sites []site, redisURL, tag string) (path string, ports map[string]int, err error) {
	pl, err := redistest.FreePorts(len(sites) + 1)
	if err != nil {
		return "", nil, err
	}
	ports = map[string]int{}
	for i, s := range sites {
		ports[s.Name] = pl[i+1]
	}
	path = filepath.Join(b.dir, "Caddyfile."+tag)
	return path, ports, os.WriteFile(path, []byte(caddyfileFor(h, pl[0], sites, ports, redisURL)), 0o644)
}

// withBare returns sites with the bare site first, added if missing (every
// pair needs it).
func withBare(sites []site) []site {
	if slices.ContainsFunc(sites, func(s site) bool { return s.Name == bareSite }) {
		return sites
	}
	return append([]site{siteByName(bareSite)}, sites...)
}

func (b *bench) spec(lr *layoutRun, s site) loadSpec {
	spec := loadSpec{Addr: fmt.Sprintf("127.0.0.1:%d", lr.ports[s.Name]), Keys: b.o.keys, Conns: lr.h.Conns}
	if s.Keys > 0 {
		spec.Keys = s.Keys
	}
	if s.Hot {
		spec.HotKey = hotKeyFor(s)
	}
	return spec
}

func lastErr(m measurement) string {
	if m.LastErr == "" {
		return ""
	}
	return " (last error: " + m.LastErr + ")"
}

// settle lets the previous run's connections close and collects garbage, so
// one run does not tax the next.
func settle() {
	runtime.GC()
	time.Sleep(200 * time.Millisecond)
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
func (b *bench) halfLoad(lr *layoutRun, rate float64) (*halfLoad, error) {
	h := &halfLoad{Rate: rate}
	for _, name := range []string{bareSite, "redis_log"} {
		settle()
		spec := b.spec(lr, siteByName(name))
		spec.Rate = rate
		spec.Warmup = b.o.warmup
		spec.Duration = b.o.halfDuration
		r := runGoLoad(b.ctx, spec)
		if b.ctx.Err() != nil {
			return nil, b.ctx.Err()
		}
		hs := halfLoadSite{
			Name: name, Achieved: r.reqPerSec(),
			P50: r.Latency.quantile(0.5), P99: r.Latency.quantile(0.99), SchedP99: r.Sched.quantile(0.99),
			Errors: r.Errors, Non2xx: r.S429 + r.SOther, Responses: r.Responses,
		}
		logf("[%s] half load %-10s %8.0f req/s (target %.0f)  p50 %s  p99 %s  p99 from schedule %s",
			lr.l.Name, name, hs.Achieved, rate, fmtMs(hs.P50), fmtMs(hs.P99), fmtMs(hs.SchedP99))
		h.Sites = append(h.Sites, hs)
	}
	return h, nil
}

func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// replot draws plotPath from a run's -json output (a run's report, as
// written): the plot of a run measured without -plot, or redrawn.
func replot(jsonPath, plotPath string) error {
	if plotPath == "" {
		return errors.New("-replot needs -plot FILE")
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("-replot %s: %w", jsonPath, err)
	}
	return writePlot(plotPath, &rep)
}
