package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// report is everything printed, and what -json writes.
type report struct {
	Machine  machine         `json:"machine"`
	Config   reportConfig    `json:"config"`
	Sites    []siteReport    `json:"sites"`
	Skipped  []skippedSite   `json:"skipped,omitempty"`
	HalfLoad *halfLoadReport `json:"half_load,omitempty"`
}

type machine struct {
	NProc     int     `json:"nproc"`
	CPU       string  `json:"cpu"`
	Go        string  `json:"go"`
	OSArch    string  `json:"os_arch"`
	Kernel    string  `json:"kernel,omitempty"`
	Redis     string  `json:"redis_server,omitempty"`
	Date      string  `json:"date"`
	LoadAvg   float64 `json:"load_avg_1m_before"`
	Generator string  `json:"generator"`
}

type reportConfig struct {
	DurationS float64 `json:"duration_s"`
	WarmupS   float64 `json:"warmup_s"`
	Conns     int     `json:"conns"`
	Keys      int     `json:"keys"`
	Rounds    int     `json:"rounds"`
}

type siteReport struct {
	Site      string   `json:"site"`
	Generator string   `json:"generator"`
	ReqPerSec float64  `json:"req_per_sec"`
	P50Ms     float64  `json:"p50_ms"`
	P99Ms     float64  `json:"p99_ms"`
	S2xx      uint64   `json:"status_2xx"`
	S429      uint64   `json:"status_429"`
	Errors    uint64   `json:"errors"` // transport errors + other statuses
	Ratio     *float64 `json:"ratio_to_none,omitempty"`
	// CaddyErrors counts error lines in Caddy's log during the site's run.
	CaddyErrors int    `json:"caddy_error_log_lines,omitempty"`
	CaddyError  string `json:"caddy_first_error,omitempty"`
	// RedisCalls is EVALSHA+EVAL executed by Redis during the measured
	// period (INFO commandstats); absent for sites without Redis.
	RedisCalls       *int64   `json:"redis_script_calls,omitempty"`
	RedisCallsPerReq *float64 `json:"redis_calls_per_request,omitempty"`
	RedisCallsPer429 *float64 `json:"redis_calls_per_denied_request,omitempty"`
}

type skippedSite struct {
	Site   string `json:"site"`
	Reason string `json:"reason"`
}

type halfLoadReport struct {
	TargetReqPerSec float64        `json:"target_req_per_sec"`
	Generator       string         `json:"generator"`
	Sites           []halfLoadJSON `json:"sites"`
	P99AddedMs      float64        `json:"p99_added_ms"`
	SchedP99AddedMs float64        `json:"p99_from_schedule_added_ms"`
}

type halfLoadJSON struct {
	Site       string  `json:"site"`
	ReqPerSec  float64 `json:"req_per_sec"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	SchedP99Ms float64 `json:"p99_from_schedule_ms"`
	Non2xx     uint64  `json:"non_2xx"`
	Errors     uint64  `json:"errors"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func buildReport(b *bench, sites []site, skipped map[string]string, results map[string]measurement, half *halfLoad) *report {
	rep := &report{
		Machine: machineInfo(b),
		Config: reportConfig{
			DurationS: b.o.duration.Seconds(), WarmupS: b.o.warmup.Seconds(),
			Conns: b.o.conns, Keys: b.o.keys, Rounds: b.o.rounds,
		},
	}
	none, haveNone := results["none"]
	for _, s := range sites {
		m := results[s.Name]
		sr := siteReport{
			Site: s.Name, Generator: m.Generator, ReqPerSec: m.ReqPerSec,
			P50Ms: ms(m.P50), P99Ms: ms(m.P99), S2xx: m.S2xx, S429: m.S429, Errors: m.Errors + m.SOther,
			CaddyErrors: m.CaddyErrors, CaddyError: m.CaddyError,
		}
		if haveNone && none.ReqPerSec > 0 {
			r := m.ReqPerSec / none.ReqPerSec
			sr.Ratio = &r
		}
		if s.Redis && m.RedisCalls >= 0 {
			c := m.RedisCalls
			sr.RedisCalls = &c
			if m.Responses > 0 {
				v := float64(c) / float64(m.Responses)
				sr.RedisCallsPerReq = &v
			}
			if m.S429 > 0 {
				v := float64(c) / float64(m.S429)
				sr.RedisCallsPer429 = &v
			}
		}
		rep.Sites = append(rep.Sites, sr)
	}
	for _, s := range allSites {
		if reason, ok := skipped[s.Name]; ok {
			rep.Skipped = append(rep.Skipped, skippedSite{Site: s.Name, Reason: reason})
		}
	}
	if half != nil && len(half.Sites) == 2 {
		h := &halfLoadReport{TargetReqPerSec: half.Rate, Generator: "go (open loop, paced)"}
		for _, s := range half.Sites {
			h.Sites = append(h.Sites, halfLoadJSON{
				Site: s.Name, ReqPerSec: s.Achieved, P50Ms: ms(s.P50), P99Ms: ms(s.P99),
				SchedP99Ms: ms(s.SchedP99), Non2xx: s.Non2xx, Errors: s.Errors,
			})
		}
		h.P99AddedMs = ms(half.Sites[1].P99 - half.Sites[0].P99)
		h.SchedP99AddedMs = ms(half.Sites[1].SchedP99 - half.Sites[0].SchedP99)
		rep.HalfLoad = h
	}
	return rep
}

func printReport(w io.Writer, rep *report) {
	mc := rep.Machine
	fmt.Fprintf(w, "\n## sliding_ratelimit end-to-end benchmark\n\n")
	fmt.Fprintf(w, "Machine: %d CPUs (nproc), %s, %s, %s", mc.NProc, mc.CPU, mc.OSArch, mc.Go)
	if mc.Kernel != "" {
		fmt.Fprintf(w, ", Linux %s", mc.Kernel)
	}
	if mc.Redis != "" {
		fmt.Fprintf(w, ", redis-server %s", mc.Redis)
	}
	fmt.Fprintf(w, ", %s, load average %.2f before the run.\n", mc.Date, mc.LoadAvg)
	fmt.Fprintf(w, "Load: %s; %d connections, %gs warm-up + %gs measured per site, %d keys (hot_* sites: 1 key), loopback.",
		mc.Generator, rep.Config.Conns, rep.Config.WarmupS, rep.Config.DurationS, rep.Config.Keys)
	if rep.Config.Rounds > 1 {
		fmt.Fprintf(w, " %d rounds; each row is the site's median-req/s run.", rep.Config.Rounds)
	}
	fmt.Fprintf(w, "\n\n")

	fmt.Fprintln(w, "| site | generator | req/s | p50 | p99 | 2xx | 429 | errors | ratio |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, s := range rep.Sites {
		ratio := "n/a"
		if s.Ratio != nil {
			ratio = fmt.Sprintf("%.2f", *s.Ratio)
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.2f ms | %.2f ms | %d | %d | %d | %s |\n",
			s.Site, s.Generator, s.ReqPerSec, s.P50Ms, s.P99Ms, s.S2xx, s.S429, s.Errors, ratio)
	}
	if len(rep.Skipped) > 0 {
		fmt.Fprintln(w, "\nSkipped (this Caddy build rejects their config):")
		for _, s := range rep.Skipped {
			fmt.Fprintf(w, "- %s: %s\n", s.Site, s.Reason)
		}
	}

	var logLines []string
	for _, s := range rep.Sites {
		if s.CaddyErrors > 0 {
			logLines = append(logLines, fmt.Sprintf("- %s: %d error lines, first: %s", s.Site, s.CaddyErrors, s.CaddyError))
		}
	}
	if len(logLines) > 0 {
		fmt.Fprintln(w, "\nCaddy logged errors during these runs (its logging is rate limited; e.g. a Redis timeout applies the fail mode, so a hot_* site may show a few 2xx):")
		for _, l := range logLines {
			fmt.Fprintln(w, l)
		}
	}

	var redisLines []string
	for _, s := range rep.Sites {
		if s.RedisCalls == nil {
			continue
		}
		line := fmt.Sprintf("- %s: %d calls", s.Site, *s.RedisCalls)
		if s.RedisCallsPerReq != nil {
			line += fmt.Sprintf(", %.3f per request", *s.RedisCallsPerReq)
		}
		if strings.HasPrefix(s.Site, "hot_") && s.RedisCallsPer429 != nil {
			line += fmt.Sprintf(", **%.4f per denied request** (%d denied)", *s.RedisCallsPer429, s.S429)
			if s.Site == "hot_denied" {
				line += ", deny cache on"
			} else {
				line += ", deny cache off"
			}
		}
		redisLines = append(redisLines, line)
	}
	if len(redisLines) > 0 {
		fmt.Fprintln(w, "\nRedis script calls (EVALSHA + EVAL, from INFO commandstats) during each measured period:")
		for _, l := range redisLines {
			fmt.Fprintln(w, l)
		}
	}

	if h := rep.HalfLoad; h != nil {
		fmt.Fprintf(w, "\np99 added at half load: open loop at %.0f req/s (half of redis_log's max), %s, %d connections:\n",
			h.TargetReqPerSec, h.Generator, rep.Config.Conns)
		for _, s := range h.Sites {
			fmt.Fprintf(w, "- %s: %.0f req/s, p50 %.2f ms, p99 %.2f ms (p99 from scheduled send: %.2f ms)", s.Site, s.ReqPerSec, s.P50Ms, s.P99Ms, s.SchedP99Ms)
			if s.Non2xx+s.Errors > 0 {
				fmt.Fprintf(w, ", %d non-2xx, %d errors", s.Non2xx, s.Errors)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "- p99 added by redis_log: **%+.2f ms** (from scheduled send: %+.2f ms)\n", h.P99AddedMs, h.SchedP99AddedMs)
		for _, s := range h.Sites {
			if s.ReqPerSec < 0.95*h.TargetReqPerSec {
				fmt.Fprintf(w, "- warning: %s reached only %.0f of %.0f req/s: it is overloaded at this rate, so its p99 includes queueing\n",
					s.Site, s.ReqPerSec, h.TargetReqPerSec)
			}
		}
	}
	fmt.Fprintln(w)
}

func machineInfo(b *bench) machine {
	m := machine{
		NProc:     nproc(),
		CPU:       cpuModel(),
		Go:        goVersion(),
		OSArch:    runtime.GOOS + "/" + runtime.GOARCH,
		Date:      time.Now().Format("2006-01-02 15:04 MST"),
		Generator: b.genDesc,
		LoadAvg:   b.loadAvg,
	}
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(k))
	}
	if b.redis != nil {
		m.Redis = redisVersion()
	}
	return m
}

// loadAvg is the 1-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func nproc() int {
	if out, err := exec.Command("nproc").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
			return n
		}
	}
	return runtime.NumCPU()
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Hardware", "cpu model":
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// goVersion is the go command's version (the toolchain that built Caddy).
func goVersion() string {
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		if v := strings.TrimSpace(string(out)); v != "" {
			return v
		}
	}
	return runtime.Version()
}

// redisVersion parses "Redis server v=7.0.15 sha=..." into "7.0.15".
func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "unknown"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return strings.TrimSpace(string(out))
}
