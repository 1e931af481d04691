package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// sample is one load run of one site, with the CPU and Redis figures of the
// same period.
type sample struct {
	measurement
	// CaddyCPU is Caddy's CPU time (utime + stime of /proc/PID/stat, all
	// threads) during the run; -1 when it could not be read.
	CaddyCPU time.Duration
	// RedisOK says RedisCPU and Scripts were read (a Redis is running).
	RedisOK bool
	// RedisCPU is used_cpu_sys + used_cpu_user (INFO cpu) during the run.
	RedisCPU time.Duration
	// Scripts is the EVALSHA + EVAL figures of INFO commandstats during the
	// run.
	Scripts redistest.CommandStat
}

// pair is one site run and one bare run next to it.
type pair struct {
	Site, Bare sample
	SiteFirst  bool
}

// ratio is the site's req/s over the bare Caddy's of the same pair.
func (p pair) ratio() (float64, bool) {
	if p.Bare.ReqPerSec <= 0 {
		return 0, false
	}
	return p.Site.ReqPerSec / p.Bare.ReqPerSec, true
}

// snapshot is the cumulative counters read before and after a run.
type snapshot struct {
	caddy   time.Duration
	caddyOK bool
	cpu     redistest.CPUStats
	cmds    redistest.CommandStats
	redisOK bool
}

// snap reads Caddy's CPU time and Redis's INFO cpu and commandstats.
func snap(ctx context.Context, caddyPid int, client *redis.Client) snapshot {
	var s snapshot
	if d, err := procs.CPU(caddyPid); err == nil {
		s.caddy, s.caddyOK = d, true
	}
	if client == nil {
		return s
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var err error
	if s.cpu, err = redistest.ReadCPU(ctx, client); err != nil {
		logf("%v", err)
		return s
	}
	if s.cmds, err = redistest.ReadCommandStats(ctx, client); err != nil {
		logf("%v", err)
		return s
	}
	s.redisOK = true
	return s
}

// fill applies the counters' change from a to b to smp.
func (smp *sample) fill(a, b snapshot) {
	smp.CaddyCPU = -1
	if a.caddyOK && b.caddyOK {
		smp.CaddyCPU = b.caddy - a.caddy
	}
	if a.redisOK && b.redisOK {
		smp.RedisOK = true
		smp.RedisCPU = b.cpu.Sub(a.cpu).Total()
		smp.Scripts = b.cmds.Scripts().Sub(a.cmds.Scripts())
	}
}

// spread is the median of some values with their range and quartiles.
type spread struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Q1     float64 `json:"q1"`
	Q3     float64 `json:"q3"`
}

// spreadOf summarizes vs (NaN values are left out); ok is false when none
// is left.
func spreadOf(vs []float64) (spread, bool) {
	s := slices.DeleteFunc(slices.Clone(vs), func(v float64) bool { return math.IsNaN(v) })
	if len(s) == 0 {
		return spread{}, false
	}
	slices.Sort(s)
	return spread{
		N: len(s), Median: quantile(s, 0.5), Min: s[0], Max: s[len(s)-1],
		Q1: quantile(s, 0.25), Q3: quantile(s, 0.75),
	}, true
}

// quantile of sorted values, interpolating between neighbours (the median
// of an even count is the mean of the two middle values).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := q * float64(len(sorted)-1)
	i := int(pos)
	if i >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	f := pos - float64(i)
	return sorted[i] + f*(sorted[i+1]-sorted[i])
}

// summary is one site's figures in one layout, from its pairs.
type summary struct {
	Ratio   spread
	RatioOK bool
	// Medians of the site's runs, and of its bare runs.
	ReqPerSec, BareReqPerSec float64
	P50, P99                 time.Duration
	// Sums over the site's runs.
	Responses, S2xx, S429, Errors uint64
	Generator                     string
	LastErr                       string
	// CaddyCPUPerReq is Caddy's CPU time per response over the site's runs
	// (0 when unknown); BareCaddyCPUPerReq the same over the bare runs of
	// the same pairs.
	CaddyCPUPerReq, BareCaddyCPUPerReq time.Duration
	// Redis figures over the site's runs (RedisOK false without Redis).
	RedisOK     bool
	RedisCalls  int64
	RedisCPU    time.Duration
	ScriptUsec  int64
	CaddyErrors int
	CaddyError  string
}

// summarize computes a site's summary from its pairs.
func summarize(pairs []pair) summary {
	var sm summary
	var ratios, rps, bareRps, p50, p99 []float64
	var caddyCPU, bareCPU time.Duration
	var bareResp uint64
	caddyOK, bareOK := len(pairs) > 0, len(pairs) > 0
	sm.RedisOK = len(pairs) > 0
	for _, p := range pairs {
		r, ok := p.ratio()
		if !ok {
			r = math.NaN()
		}
		ratios = append(ratios, r)
		s := p.Site
		rps = append(rps, s.ReqPerSec)
		bareRps = append(bareRps, p.Bare.ReqPerSec)
		p50 = append(p50, float64(s.P50))
		p99 = append(p99, float64(s.P99))
		sm.Responses += s.Responses
		sm.S2xx += s.S2xx
		sm.S429 += s.S429
		sm.Errors += s.Errors + s.SOther
		sm.Generator = cmp.Or(sm.Generator, s.Generator)
		sm.LastErr = cmp.Or(s.LastErr, sm.LastErr)
		sm.CaddyErrors += s.CaddyErrors
		sm.CaddyError = cmp.Or(sm.CaddyError, s.CaddyError)
		caddyOK = caddyOK && s.CaddyCPU >= 0
		caddyCPU += s.CaddyCPU
		bareOK = bareOK && p.Bare.CaddyCPU >= 0
		bareCPU += p.Bare.CaddyCPU
		bareResp += p.Bare.Responses
		sm.RedisOK = sm.RedisOK && s.RedisOK
		sm.RedisCalls += s.Scripts.Calls
		sm.ScriptUsec += s.Scripts.Usec
		sm.RedisCPU += s.RedisCPU
	}
	sm.Ratio, sm.RatioOK = spreadOf(ratios)
	med := func(vs []float64) float64 { s, _ := spreadOf(vs); return s.Median }
	sm.ReqPerSec, sm.BareReqPerSec = med(rps), med(bareRps)
	sm.P50, sm.P99 = time.Duration(med(p50)), time.Duration(med(p99))
	if caddyOK && sm.Responses > 0 {
		sm.CaddyCPUPerReq = caddyCPU / time.Duration(sm.Responses)
	}
	if bareOK && bareResp > 0 {
		sm.BareCaddyCPUPerReq = bareCPU / time.Duration(bareResp)
	}
	return sm
}

// Per-request and per-call Redis figures; ok is false when a divisor is 0.

func (sm summary) callsPerReq() (float64, bool) {
	if !sm.RedisOK || sm.Responses == 0 {
		return 0, false
	}
	return float64(sm.RedisCalls) / float64(sm.Responses), true
}

func (sm summary) redisCPUPerReq() (time.Duration, bool) {
	if !sm.RedisOK || sm.Responses == 0 {
		return 0, false
	}
	return sm.RedisCPU / time.Duration(sm.Responses), true
}

func (sm summary) redisCPUPerCall() (time.Duration, bool) {
	if !sm.RedisOK || sm.RedisCalls <= 0 {
		return 0, false
	}
	return sm.RedisCPU / time.Duration(sm.RedisCalls), true
}

func (sm summary) scriptUsecPerCall() (float64, bool) {
	if !sm.RedisOK || sm.RedisCalls <= 0 {
		return 0, false
	}
	return float64(sm.ScriptUsec) / float64(sm.RedisCalls), true
}

// scriptUsecPerReq is the scripts' execution time (INFO commandstats usec)
// per request: per check on the sites where every request is checked in
// Redis, whether or not checks are batched into one call.
func (sm summary) scriptUsecPerReq() (float64, bool) {
	if !sm.RedisOK || sm.Responses == 0 {
		return 0, false
	}
	return float64(sm.ScriptUsec) / float64(sm.Responses), true
}

// trivial is the baseline of a trivial script measured in the same run: a
// burst of EVAL "return 1" 0, pipelined.
type trivial struct {
	Calls    int64
	Pipeline int
	// UsecPerCall is INFO commandstats' time executing one call.
	UsecPerCall float64
	// CPUPerCall is Redis's CPU time (INFO cpu) per call over the burst,
	// reading and answering the pipelined commands included.
	CPUPerCall time.Duration
}

// trivialEval runs n EVAL "return 1" 0 in pipelines of depth and measures
// their cost in Redis.
func trivialEval(ctx context.Context, c *redis.Client, n, depth int) (*trivial, error) {
	cs0, err := redistest.ReadCommandStats(ctx, c)
	if err != nil {
		return nil, err
	}
	cpu0, err := redistest.ReadCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	for done := 0; done < n; done += depth {
		pipe := c.Pipeline()
		for range min(depth, n-done) {
			pipe.Eval(ctx, "return 1", nil)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("EVAL \"return 1\" 0: %w", err)
		}
	}
	cpu1, err := redistest.ReadCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	cs1, err := redistest.ReadCommandStats(ctx, c)
	if err != nil {
		return nil, err
	}
	d := cs1["eval"].Sub(cs0["eval"])
	if d.Calls <= 0 {
		return nil, fmt.Errorf("INFO commandstats counted no EVAL after %d calls", n)
	}
	return &trivial{
		Calls: d.Calls, Pipeline: depth, UsecPerCall: d.UsecPerCall,
		CPUPerCall: cpu1.Sub(cpu0).Total() / time.Duration(d.Calls),
	}, nil
}
