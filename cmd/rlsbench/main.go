// Command rlsbench measures this engine as Envoy's rate limit service
// (cmd/rls) beside envoyproxy/ratelimit, the reference service, in the same
// run: both on loopback, on one redis-server of its own, with the same
// descriptor config (one descriptor "key", 1,000 a minute per value) as a
// fixed window, and ours also as a sliding_log. A gRPC load client (the
// RateLimitService client generated in go-control-plane, one goroutine per
// check in flight, closed loop, 10,000 keys at random) drives each service
// in short runs, rounds of one run per service with the order reversed
// every other round, at two settings of connections x checks in flight.
// It prints checks per second, p50 and p99 per check, the service's and
// Redis's CPU per check, and each of ours' ratio to envoyproxy/ratelimit's
// in the same round: the median of the rounds with their range.
//
//	ENVOY_RLS=/path/to/ratelimit-clone go run ./cmd/rlsbench    # builds it (go build ./src/service_cmd)
//	go run ./cmd/rlsbench -envoy /path/to/ratelimit-binary -rounds 9 -run 2s
//	go run ./cmd/rlsbench                                        # ours alone: envoyproxy/ratelimit is named absent
//
// envoyproxy/ratelimit runs twice: with its defaults (REDIS_PIPELINE_WINDOW
// 0, each command flushed alone), and with the write buffering its README
// recommends for throughput (REDIS_PIPELINE_WINDOW=150us). It needs
// redis-server and go on PATH; every process it starts is stopped on exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func init() {
	// Children die with the thread that started them (Pdeathsig): keep
	// main on one thread.
	runtime.LockOSThread()
}

// setting is one load shape: gRPC connections x checks in flight.
type setting struct{ Conns, InFlight int }

func (s setting) String() string { return fmt.Sprintf("%d conn x %d in flight", s.Conns, s.InFlight) }

func parseSettings(v string) ([]setting, error) {
	var out []setting
	for _, f := range strings.Split(v, ",") {
		c, n, ok := strings.Cut(strings.TrimSpace(f), "x")
		conns, err1 := strconv.Atoi(c)
		inFlight, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || conns <= 0 || inFlight < conns {
			return nil, fmt.Errorf("-settings: %q is not CONNSxINFLIGHT (e.g. 1x8, in flight >= connections)", f)
		}
		out = append(out, setting{conns, inFlight})
	}
	return out, nil
}

type options struct {
	envoy    string
	rounds   int
	run      time.Duration
	warmup   time.Duration
	keys     int
	limit    int
	settings []setting
	window   string
	keep     bool
	quick    bool
}

const envoyHelp = "envoyproxy/ratelimit: a clone of github.com/envoyproxy/ratelimit (built with go build ./src/service_cmd) or its built binary (default $ENVOY_RLS)"

func main() { os.Exit(run()) }

func run() int {
	defer cleanup.Run()
	var o options
	var settings string
	flag.StringVar(&o.envoy, "envoy", os.Getenv("ENVOY_RLS"), envoyHelp)
	flag.IntVar(&o.rounds, "rounds", 9, "rounds per setting (each a pair of runs, back to back, of each of ours with each envoyproxy/ratelimit)")
	flag.DurationVar(&o.run, "run", 500*time.Millisecond, "measured load of each run")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured load on each service before a setting's rounds")
	flag.IntVar(&o.keys, "keys", 10000, "distinct descriptor values, drawn at random per check")
	flag.IntVar(&o.limit, "limit", 1000, "requests_per_unit (a minute) of the descriptor")
	flag.StringVar(&settings, "settings", "1x8,4x64", "comma-separated CONNSxINFLIGHT: gRPC connections x checks in flight")
	flag.StringVar(&o.window, "envoy-pipeline-window", "150us", "REDIS_PIPELINE_WINDOW of the second envoyproxy/ratelimit (its README's advice for throughput); \"\" runs only the default one")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, logs, binaries)")
	flag.BoolVar(&o.quick, "quick", false, "smoke test: 1 round of 300ms, warmup 200ms")
	flag.Parse()
	if flag.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if o.quick {
		o.rounds, o.run, o.warmup = 1, 300*time.Millisecond, 200*time.Millisecond
	}
	var err error
	if o.settings, err = parseSettings(settings); err != nil {
		return fail(err)
	}
	if o.rounds <= 0 || o.run <= 0 || o.keys <= 0 || o.limit <= 0 || o.warmup < 0 {
		return fail(errors.New("-rounds, -run, -keys and -limit must be positive, -warmup not negative"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	rep, err := bench(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "rlsbench: interrupted; stopping the services and redis-server")
			return 130
		}
		return fail(err)
	}
	printReport(os.Stdout, rep)
	return 0
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "rlsbench: %v\n", err)
	return 1
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rlsbench: "+format+"\n", args...)
}

// envoyAbsent is what the run says when no envoyproxy/ratelimit is given.
const envoyAbsent = "envoyproxy/ratelimit NOT measured: no -envoy flag or ENVOY_RLS given. " +
	"To measure it beside ours: git clone https://github.com/envoyproxy/ratelimit /tmp/ratelimit && ENVOY_RLS=/tmp/ratelimit make bench"

// envoySource says what -envoy names: a clone to build, a binary, or
// nothing (""), with a clear error when the path is neither.
func envoySource(path string) (kind string, err error) {
	if path == "" {
		return "", nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("-envoy / ENVOY_RLS %s: %w", path, err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "src", "service_cmd")); err != nil {
			return "", fmt.Errorf("-envoy / ENVOY_RLS %s is a directory but not a clone of github.com/envoyproxy/ratelimit (no src/service_cmd)", path)
		}
		return "clone", nil
	}
	if fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("-envoy / ENVOY_RLS %s is not executable (give the ratelimit binary or a clone)", path)
	}
	return "binary", nil
}

// report is the whole run.
type report struct {
	Date     time.Time
	Machine  string
	Redis    string
	Envoy    string // what envoyproxy/ratelimit was (commit), or envoyAbsent
	Ours     string
	Keys     int
	Limit    int
	Rounds   int
	Run      time.Duration
	Services []*service
	Settings []settingResult
}

type settingResult struct {
	Setting setting
	Pairs   []pairSpec
	Rounds  [][]pairRun // per round, per pair
}

// pairSpec is a pair of services (indexes of Services): A ours, B theirs.
type pairSpec struct{ A, B int }

// pairRun is one round's runs of a pair, back to back.
type pairRun struct{ A, B runResult }

// randKey draws one of n keys.
func randKey(r *rand.Rand, n int) string { return "k" + strconv.Itoa(r.IntN(n)) }
