package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// service is one rate limit service under load: a domain on a gRPC
// address, served by a process.
type service struct {
	Name   string // as the tables show it
	Desc   string
	Domain string
	Envoy  bool
	Addr   string `json:"-"`
	proc   *procs.Proc
}

// descriptors is the descriptor config both services load: one entry key
// "key", every value counted apart, limit a minute.
func descriptors(limit int) string {
	return fmt.Sprintf("descriptors:\n  - key: key\n    rate_limit:\n      unit: minute\n      requests_per_unit: %d\n", limit)
}

// oursConfig is cmd/rls's file: envoyproxy/ratelimit's shape plus the
// engine's algorithm, the Redis, and headers off (envoyproxy/ratelimit
// adds none by default).
func oursConfig(domain, algorithm, redisAddr string, limit int) string {
	return fmt.Sprintf("domain: %s\nalgorithm: %s\nheaders: off\nredis:\n  url: redis://%s\n", domain, algorithm, redisAddr) +
		descriptors(limit)
}

func envoyConfig(domain string, limit int) string {
	return "domain: " + domain + "\n" + descriptors(limit)
}

func bench(ctx context.Context, o options) (*report, error) {
	kind, err := envoySource(o.envoy)
	if err != nil {
		return nil, err
	}
	root := output("", "go", "list", "-m", "-f", "{{.Dir}}")
	if root == "" {
		return nil, errors.New("go list -m: run rlsbench in this repository (go run ./cmd/rlsbench)")
	}
	dir, err := os.MkdirTemp("", "sliding-ratelimit-rlsbench-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		logf("keeping %s", dir)
	} else {
		cleanup.Add(func() { _ = os.RemoveAll(dir) })
	}
	rep := &report{Date: time.Now().UTC(), Machine: machine(), Keys: o.keys, Limit: o.limit, Rounds: o.rounds, Run: o.run}

	// Binaries: ours, and envoyproxy/ratelimit's (built from its clone).
	t := time.Now()
	oursBin := filepath.Join(dir, "rls")
	logf("building cmd/rls (go build ./cmd/rls) in %s", root)
	if err := goBuild(ctx, root, oursBin, "./cmd/rls"); err != nil {
		return nil, err
	}
	rep.Ours = "cmd/rls at " + cmpOr(output(root, "git", "describe", "--always", "--dirty"), "?")
	envoyBin := ""
	switch kind {
	case "":
		rep.Envoy = envoyAbsent
		logf("%s", envoyAbsent)
	case "clone":
		envoyBin = filepath.Join(dir, "ratelimit")
		logf("building envoyproxy/ratelimit (go build -mod=readonly ./src/service_cmd) in %s; the first build downloads its modules", o.envoy)
		if err := goBuild(ctx, o.envoy, envoyBin, "./src/service_cmd", "-mod=readonly"); err != nil {
			return nil, err
		}
		rep.Envoy = "envoyproxy/ratelimit at " + cmpOr(output(o.envoy, "git", "log", "-1", "--format=%h (%cs)"), "? (not a git checkout)") +
			", built from source with " + runtime.Version()
	case "binary":
		envoyBin = o.envoy
		rep.Envoy = "envoyproxy/ratelimit binary " + o.envoy
	}
	logf("built in %v", time.Since(t).Round(100*time.Millisecond))

	// One redis-server, the bench's own.
	rp, err := redistest.Launch(redistest.LaunchOptions{Dir: dir, Args: []string{"--protected-mode", "yes"}})
	if err != nil {
		return nil, err
	}
	cleanup.Add(rp.Stop)
	defer rp.Stop()
	rc := redis.NewClient(&redis.Options{Addr: rp.Addr(), DialTimeout: time.Second, MaxRetries: -1})
	defer rc.Close()
	info, _ := redistest.Info(ctx, rc, "server")
	rep.Redis = "redis-server " + cmpOr(info["redis_version"], "?") + " on " + rp.Addr() + " (the bench's own)"
	logf("%s, pid %d", rep.Redis, rp.Pid())

	// Ours: one cmd/rls, two domains (fixed_window, sliding_log).
	ports, err := redistest.FreePorts(8)
	if err != nil {
		return nil, err
	}
	var cfgs []string
	for _, c := range []struct{ domain, alg string }{{"bench_fixed", "fixed_window"}, {"bench_log", "sliding_log"}} {
		p := filepath.Join(dir, c.domain+".yaml")
		if err := os.WriteFile(p, []byte(oursConfig(c.domain, c.alg, rp.Addr(), o.limit)), 0o644); err != nil {
			return nil, err
		}
		cfgs = append(cfgs, "-config", p)
	}
	oursAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	op, err := procs.Start(&cleanup, "rls", filepath.Join(dir, "rls.log"), "", os.Environ(), oursBin,
		append(cfgs, "-grpc", oursAddr, "-http", "127.0.0.1:"+strconv.Itoa(ports[1]))...)
	if err != nil {
		return nil, err
	}
	defer op.Stop()
	rep.Services = append(rep.Services,
		&service{Name: "ours fixed_window", Desc: "cmd/rls, algorithm fixed_window", Domain: "bench_fixed", Addr: oursAddr, proc: op},
		&service{Name: "ours sliding_log", Desc: "cmd/rls, algorithm sliding_log (exact)", Domain: "bench_log", Addr: oursAddr, proc: op})

	// envoyproxy/ratelimit: its defaults, then with write buffering.
	if envoyBin != "" {
		variants := []struct{ name, desc, window string }{{"envoy", "envoyproxy/ratelimit, its defaults (REDIS_PIPELINE_WINDOW 0)", ""}}
		if o.window != "" {
			variants = append(variants, struct{ name, desc, window string }{"envoy pipelined",
				"envoyproxy/ratelimit, REDIS_PIPELINE_WINDOW=" + o.window, o.window})
		}
		for i, v := range variants {
			rt := filepath.Join(dir, fmt.Sprintf("envoy-runtime-%d", i))
			cd := filepath.Join(rt, "ratelimit", "config")
			if err := os.MkdirAll(cd, 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(cd, "bench.yaml"), []byte(envoyConfig("bench_fixed", o.limit)), 0o644); err != nil {
				return nil, err
			}
			addr := "127.0.0.1:" + strconv.Itoa(ports[2+3*i])
			env := append(os.Environ(),
				"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[3+3*i]),
				"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[4+3*i]),
				"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[2+3*i]),
				"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rp.Addr(),
				"RUNTIME_ROOT="+rt, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
				// Its default statsd sink, on a port nobody listens on.
				"USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT="+strconv.Itoa(ports[7]),
				"LOG_LEVEL=warn")
			if v.window != "" {
				env = append(env, "REDIS_PIPELINE_WINDOW="+v.window)
			}
			ep, err := procs.Start(&cleanup, v.name, filepath.Join(dir, fmt.Sprintf("envoy-%d.log", i)), "", env, envoyBin)
			if err != nil {
				return nil, err
			}
			defer ep.Stop()
			rep.Services = append(rep.Services, &service{Name: v.name, Desc: v.desc, Domain: "bench_fixed", Envoy: true, Addr: addr, proc: ep})
		}
	}

	// Each must serve the config: limit checks pass, one more is refused.
	for _, s := range rep.Services {
		if err := verify(ctx, s, o.limit); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		logf("%s on %s (pid %d): serves domain %s, %d a minute per key, OVER_LIMIT past it", s.Name, s.Addr, s.proc.Pid(), s.Domain, o.limit)
	}

	la := procs.LoadAvg()
	if n := runtime.NumCPU(); la > 0.5*float64(n) {
		logf("warning: load average %.2f on %d CPUs before the run: other processes compete; the ratios (same round) hold better than the rates", la, n)
	}
	rep.Machine += fmt.Sprintf("; load average %.2f before the run", la)
	for _, st := range o.settings {
		sr, err := runSetting(ctx, o, rep.Services, st, rc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st, err)
		}
		rep.Settings = append(rep.Settings, *sr)
	}
	return rep, nil
}

// verify waits for s to serve (up to 60s), then checks that it applies the
// config: limit checks of one key pass in one request (hits_addend), and
// one more is OVER_LIMIT. A service that answered OK to every check (an
// unknown domain, a config not loaded) would be measured doing nothing.
func verify(ctx context.Context, s *service, limit int) error {
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	key := "verify-" + strings.ReplaceAll(s.Name, " ", "-")
	check := func(hits int) (*pb.RateLimitResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return c.ShouldRateLimit(cctx, request(s.Domain, key, uint32(hits)))
	}
	deadline := time.Now().Add(60 * time.Second)
	var resp *pb.RateLimitResponse
	for {
		if s.proc.Exited() {
			return fmt.Errorf("exited:\n%s", s.proc.LogTail(20))
		}
		resp, err = check(limit)
		if err == nil && len(resp.Statuses) == 1 && resp.Statuses[0].CurrentLimit != nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("answers %v without the descriptor's limit: the config is not loaded", resp)
			}
			return fmt.Errorf("not serving after 60s: %v\n%s", err, s.proc.LogTail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := resp.Statuses[0]
	if resp.OverallCode != pb.RateLimitResponse_OK || st.CurrentLimit.RequestsPerUnit != uint32(limit) {
		return fmt.Errorf("%d checks of a fresh key: got %v, limit %d (want OK, limit %d)", limit, resp.OverallCode, st.CurrentLimit.RequestsPerUnit, limit)
	}
	if resp, err = check(1); err != nil {
		return err
	}
	if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		return fmt.Errorf("check %d of a key with limit %d: got %v, want OVER_LIMIT", limit+1, limit, resp.OverallCode)
	}
	return nil
}

// request is one check: the descriptor key=value in domain.
func request(domain, value string, hits uint32) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{
		Domain:      domain,
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "key", Value: value}}}},
		HitsAddend:  hits,
	}
}

func machine() string {
	model := ""
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	return fmt.Sprintf("%d vCPUs%s, %s", runtime.NumCPU(), model, runtime.Version())
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
