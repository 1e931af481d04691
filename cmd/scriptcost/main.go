// Command scriptcost measures what Redis spends per check of the script, in
// the batches Caddy sends, beside a four-command baseline script
// (ZREMRANGEBYSCORE, ZCARD, ZADD of one member, PEXPIRE) on the same keys:
// the figures docs/bench.md's "Redis's side" section gives. It starts its
// own redis-server on a free port unless -addr names one (for one started
// under valgrind, which counts instructions whatever else the machine does):
//
//	go run ./cmd/scriptcost                          # sliding_log, FCALL, batches of 16
//	go run ./cmd/scriptcost -kind 3 -batch 1 -eval   # fixed_window, one check per EVALSHA
//	go run ./cmd/scriptcost -kind 4 -cached          # token_bucket, EVALSHA of lua.DecideCached (Redis 5, 6)
//	go run ./cmd/scriptcost -kind 12                 # sliding_counter in format 3 (state_format 3; -kind 2: format 4)
//	go run ./cmd/scriptcost -format 1                # sliding_log written in the previous releases' format (2: the one before 3)
//	go run ./cmd/scriptcost -kind 20                 # go-redis/redis_rate's GCRA script, by the library (a peer)
//	valgrind --tool=callgrind --toggle-collect=fcallCommand redis-server --port 46887 &
//	go run ./cmd/scriptcost -addr 127.0.0.1:46887 -keys 500 -fill 1 -n 10000 -baseline=false
//
// The checks are those of a one-window limit of -limit (10,000) a minute keyed over
// -keys keys, each key getting -per checks a window (so its set holds about
// -per entries), on a clock the tool moves (clock app), each with a deadline
// an hour after its time, as Caddy sends them. With -eval they go by the script the store sends such
// checks by: the kind's fast script (lua.DecideFast: sliding_log,
// sliding_counter in format 4, fixed_window, token_bucket), the log's
// (format 1) or the full one (the counter in format 3: kind 12); the
// first line of the output names it. With -cached they go by
// lua.DecideCached, the script the store sends Redis 5 and 6 (the body
// built at its first call, kept in a global): on Redis 7, which refuses the
// global, each call builds it. EVALSHA's ratio to FCALL is two runs
// under callgrind, one with -eval (docs/bench.md). The baseline's sets are keys of their own, filled the
// same way.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// deadlineAfter is how long after its time (µs) a check's deadline is.
const deadlineAfter = 3600e6

// baseline is the original design's script, for 16 keys a call as ours.
const baseline = `for i = 1, #KEYS do
  local k = KEYS[i]
  redis.call("ZREMRANGEBYSCORE", k, 0, ARGV[2*i-1] - 60000000)
  redis.call("ZCARD", k)
  redis.call("ZADD", k, ARGV[2*i-1], ARGV[2*i])
  redis.call("PEXPIRE", k, 61000)
end
return 1`

func main() {
	addr := flag.String("addr", "", "a running redis-server (default: start one on a free port)")
	keys := flag.Int("keys", 10000, "keys")
	per := flag.Int("per", 150, "checks per key per window (about the entries of a log)")
	limit := flag.Int64("limit", 10000, "the limit of the one-minute window (make bench's many-key sites: 10000 for sliding_log, 1000000000 for the others)")
	n := flag.Int("n", 200000, "checks measured (in 5 rounds)")
	batch := flag.Int("batch", 16, "checks per call")
	kind := flag.Int("kind", 1, "1 sliding_log, 2 sliding_counter (format 4; 12: format 3, state_format 3), 3 fixed_window, 4 token_bucket; 20 go-redis/redis_rate's GCRA (its AllowN: EVALSHA, 1 a call)")
	eval := flag.Bool("eval", false, "EVALSHA of the script the store sends Redis 7 by EVALSHA (ScriptsEval) instead of FCALL of the library")
	cached := flag.Bool("cached", false, "EVALSHA of lua.DecideCached, the script the store sends Redis 5 and 6")
	fill := flag.Float64("fill", 2, "windows of checks sent before measuring")
	base := flag.Bool("baseline", true, "measure the baseline script too, in turns with ours")
	format := flag.Int("format", 3, "the state format sliding_log keys are written in (1, 2: as redis { state_format 1 }, { state_format 2 })")
	peer := flag.Bool("redis_rate", false, "measure go-redis/redis_rate's GCRA too (EVALSHA, 1 a call, its own keys), in turns with ours and the baseline")
	flag.Parse()
	k := *kind
	if k == kindRedisRate {
		if err := runRedisRate(os.Stdout, *addr, *keys, *per, *n, *fill); err != nil {
			fmt.Fprintln(os.Stderr, "scriptcost:", err)
			os.Exit(1)
		}
		return
	}
	if k == 1 && *format == 1 {
		k = 7 // decide.lua's kind of the log written in format 1
	} else if k == 1 && *format == 3 {
		k = 11 // in format 3, the default
	}
	if err := run(os.Stdout, *addr, *keys, *per, *n, *batch, k, *limit, *eval, *cached, *fill, *base, *peer); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

// run measures ours (kind, by FCALL or EVALSHA, batch checks a call) and,
// in turns with it in each of 5 rounds, the baseline (base) and
// redis_rate's GCRA (peer), each on keys of its own on the one server, so
// their figures come from the same run; it ends with each one's median
// Redis CPU per check and their ratios.
func run(w io.Writer, addr string, keys, per, n, batch, kind int, limit int64, eval, cached bool, fill float64, base, peer bool) error {
	ctx := context.Background()
	if addr == "" {
		a, stop, err := startRedis()
		if err != nil {
			return err
		}
		defer stop()
		addr = a
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	call := []any{"FCALL", lua.DecideFunction}
	eval = eval || cached
	if eval {
		src := evalScript(kind)
		if cached {
			src = lua.DecideCached
		}
		sha, err := c.ScriptLoad(ctx, src).Result()
		if err != nil {
			return err
		}
		call = []any{"EVALSHA", sha}
	} else if err := c.Do(ctx, "FUNCTION", "LOAD", "REPLACE", lua.LibraryCode).Err(); err != nil {
		return err
	}
	bsha, err := c.ScriptLoad(ctx, baseline).Result()
	if err != nil {
		return err
	}
	// mode 0, cost 1, one part of kind, one window of a minute, limit -limit
	shape := "[0,1,1,0,0,0," + strconv.Itoa(kind) + ",1,0,\"60000000\",60000000," + strconv.FormatInt(limit, 10) + ",0]"
	step := 60e6 / float64(per*keys) // µs between two checks
	// The clock starts at a whole minute: every run meets its windows (and
	// sliding_counter's buckets) at the same offsets, so two runs under
	// callgrind count the same work (from the wall clock's µs, the
	// counter's varied by 1k instructions a check from run to run).
	now := float64(time.Now().Truncate(time.Minute).UnixMicro())
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() string { return "ratelimit:bench:log:{k" + strconv.Itoa(rng.IntN(keys)) + "}" }
	// The baseline's sets are keys of their own (ours may be hashes), filled
	// as ours are.
	baseKey := func() string { return "ratelimit:bench:base:{k" + strconv.Itoa(rng.IntN(keys)) + "}" }
	ours := func(checks int) error {
		for done := 0; done < checks; done += batch {
			// The call's bases (decide.lua's header): one below the
			// earliest deadline and now, its first check's; its nows go
			// whole (base 0) for the log in format 3 (kind 11), whose fast
			// path writes their digits.
			base := math.Round(now+step+deadlineAfter) - 1
			nbase := math.Round(now+step) - 1
			if kind == 11 {
				nbase = 0
			}
			ks, av := make([]any, 0, batch), []any{batch, strconv.FormatFloat(base, 'f', 0, 64), strconv.FormatFloat(nbase, 'f', 0, 64)}
			for range batch {
				now += step
				ks = append(ks, key())
				// One check as the store encodes it (see decide.lua's header):
				// its deadline its time and an hour, a number of its own as
				// each request's is (its time and timeout), never passed in
				// a run under valgrind; it and its now sent relative to the
				// call's bases.
				av = append(av, shape, strconv.FormatFloat(math.Round(now)-nbase, 'f', 0, 64), strconv.FormatFloat(math.Round(now+deadlineAfter)-base, 'f', 0, 64))
			}
			args := append(append(append(append([]any{}, call...), len(ks)), ks...), av...)
			if err := c.Do(ctx, args...).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	theirs := func(checks int) error {
		for done := 0; done < checks; done += batch {
			args, av := []any{"EVALSHA", bsha, batch}, []any{}
			for j := range batch {
				now += step
				args = append(args, baseKey())
				t := strconv.FormatFloat(now, 'f', 0, 64)
				av = append(av, t, t+"-"+strconv.Itoa(j))
			}
			if err := c.Do(ctx, append(args, av...)...).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := ours(int(fill * float64(per*keys))); err != nil {
		return err
	}
	if base {
		if err := theirs(int(fill * float64(per*keys))); err != nil {
			return err
		}
	}
	var rate func(int) error
	var describe func() string
	if peer {
		rate, describe = redisRate(ctx, c, keys)
		if err := rate(int(fill * float64(per*keys))); err != nil {
			return err
		}
	}
	name := strings.ToLower(call[0].(string))
	path := name
	if cached {
		path += " of the cached script"
	} else if eval {
		path += " of " + evalName(kind)
	}
	var oursU, oursC, baseU, baseC, rateU, rateC []string
	for range 5 {
		u, cpu, err := measure(ctx, c, name, func() error { return ours(n / 5) })
		if err != nil {
			return err
		}
		oursU, oursC = append(oursU, perCheck(u, n/5)), append(oursC, perCheck(cpu, n/5))
		if base {
			u, cpu, err = measure(ctx, c, "evalsha", func() error { return theirs(n / 5) })
			if err != nil {
				return err
			}
			baseU, baseC = append(baseU, perCheck(u, n/5)), append(baseC, perCheck(cpu, n/5))
		}
		if peer {
			u, cpu, err = measure(ctx, c, "evalsha", func() error { return rate(n / 5) })
			if err != nil {
				return err
			}
			rateU, rateC = append(rateU, perCheck(u, n/5)), append(rateC, perCheck(cpu, n/5))
		}
	}
	fmt.Fprintf(w, "kind %d, %s, %d checks a call, %d keys of about %d entries (a key: %d, %s)\n", kind, path, batch, keys, per,
		c.ZCard(ctx, "ratelimit:bench:log:{k1}").Val(), c.ObjectEncoding(ctx, "ratelimit:bench:log:{k1}").Val())
	fmt.Fprintf(w, "ours:     µs in the call per check %s; Redis CPU µs per check %s\n", strings.Join(oursU, " "), strings.Join(oursC, " "))
	if base {
		fmt.Fprintf(w, "baseline: µs in the call per check %s; Redis CPU µs per check %s\n", strings.Join(baseU, " "), strings.Join(baseC, " "))
	}
	if peer {
		fmt.Fprintf(w, "redis_rate: µs in the call per check %s; Redis CPU µs per check %s (%s)\n", strings.Join(rateU, " "), strings.Join(rateC, " "), describe())
	}
	if base || peer {
		summary := "median Redis CPU µs per check, this run: ours " + median(oursC)
		if base {
			summary += ", the four-command baseline " + median(baseC) + " (ours ÷ it " + ratio(oursC, baseC) + ")"
		}
		if peer {
			summary += ", redis_rate " + median(rateC) + " (ours ÷ it " + ratio(oursC, rateC) + ")"
		}
		fmt.Fprintln(w, summary)
	}
	return nil
}

// median is the middle of figures printed by perCheck.
func median(figs []string) string {
	return strconv.FormatFloat(medianOf(figs), 'f', 2, 64)
}

func medianOf(figs []string) float64 {
	v := make([]float64, len(figs))
	for i, f := range figs {
		v[i], _ = strconv.ParseFloat(f, 64)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// ratio is the ratio of two sets of figures' medians.
func ratio(a, b []string) string {
	if mb := medianOf(b); mb > 0 {
		return strconv.FormatFloat(medianOf(a)/mb, 'f', 2, 64) + "x"
	}
	return "n/a"
}

// evalScript is the script the store sends by EVALSHA for checks of the
// tool's form (mode 0, one part of one window, nothing else) of kind:
// the kind's fast script where it has one (lua.DecideFast), the log's
// (lua.DecideLog) for a log in format 1, else the full one.
func evalScript(kind int) string {
	if kind == 11 {
		kind = 1 // the log's format 3 goes by the log's fast script, as the store sends it
	}
	if src, ok := lua.DecideFast[kind]; ok {
		return src
	}
	if kind == 7 {
		return lua.DecideLog
	}
	return lua.Decide
}

// evalName names evalScript's script for kind.
func evalName(kind int) string {
	if kind == 11 {
		kind = 1
	}
	if _, ok := lua.DecideFast[kind]; ok {
		return "its kind's fast script"
	}
	if kind == 7 {
		return "the log's script"
	}
	return "the full script"
}

func perCheck(us float64, checks int) string {
	return strconv.FormatFloat(us/float64(checks), 'f', 2, 64)
}

// measure runs f and returns the µs Redis spent in calls of cmd
// (commandstats) and its CPU µs (INFO cpu) meanwhile.
func measure(ctx context.Context, c *redis.Client, cmd string, f func() error) (usec, cpu float64, err error) {
	u0, c0 := stats(ctx, c, cmd)
	if err := f(); err != nil {
		return 0, 0, err
	}
	u1, c1 := stats(ctx, c, cmd)
	return u1 - u0, (c1 - c0) * 1e6, nil
}

func stats(ctx context.Context, c *redis.Client, cmd string) (usec, cpu float64) {
	for _, line := range strings.Split(c.Info(ctx, "commandstats", "cpu").Val(), "\r\n") {
		name, val, _ := strings.Cut(line, ":")
		switch name {
		case "cmdstat_" + cmd:
			for _, kv := range strings.Split(val, ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					usec, _ = strconv.ParseFloat(v, 64)
				}
			}
		case "used_cpu_sys", "used_cpu_user":
			v, _ := strconv.ParseFloat(val, 64)
			cpu += v
		}
	}
	return usec, cpu
}

// startRedis starts a redis-server on a free loopback port, files in a
// temporary directory; stop kills it and removes them.
func startRedis() (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "scriptcost")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("redis-server: %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	addr = "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		if i == 100 {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
