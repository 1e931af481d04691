package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is everything printed, and what -json writes.
type report struct {
	Machine machine        `json:"machine"`
	Config  reportConfig   `json:"config"`
	Layouts []layoutReport `json:"layouts"`
	Skipped []skippedSite  `json:"skipped,omitempty"`
	Micro   *microResult   `json:"micro_benchmark,omitempty"`
}

type machine struct {
	NProc      int     `json:"nproc"`
	CPU        string  `json:"cpu"`
	Go         string  `json:"go"`
	OSArch     string  `json:"os_arch"`
	Kernel     string  `json:"kernel,omitempty"`
	Redis      string  `json:"redis_server,omitempty"`
	Date       string  `json:"date"`
	LoadAvg    float64 `json:"load_avg_1m_before"`
	Generator  string  `json:"generator"`
	LayoutNote string  `json:"layout_note,omitempty"`
}

type reportConfig struct {
	Pairs         int     `json:"pairs"`
	PairDurationS float64 `json:"pair_duration_s"`
	WarmupS       float64 `json:"warmup_s"`
	Conns         int     `json:"conns"`
	Keys          int     `json:"keys"`
}

type layoutReport struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Harness     string          `json:"harness"`
	HarnessDesc string          `json:"harness_description"`
	Conns       int             `json:"conns"`
	CaddyCPU    *int            `json:"caddy_cpu,omitempty"`
	LoadCPU     *int            `json:"load_and_redis_cpu,omitempty"`
	Verified    string          `json:"pinning_checked,omitempty"`
	Trivial     *trivialJSON    `json:"trivial_eval,omitempty"`
	TrivialErr  string          `json:"trivial_eval_error,omitempty"`
	Sites       []siteReport    `json:"sites"`
	HalfLoad    *halfLoadReport `json:"half_load,omitempty"`
}

type trivialJSON struct {
	Calls       int64   `json:"calls"`
	Pipeline    int     `json:"pipeline_depth"`
	UsPerCall   float64 `json:"commandstats_us_per_call"`
	CPUUsPerCal float64 `json:"redis_cpu_us_per_call"`
}

type siteReport struct {
	Site          string    `json:"site"`
	Description   string    `json:"description,omitempty"`
	Generator     string    `json:"generator"`
	Ratio         *spread   `json:"ratio_to_bare,omitempty"`
	PairRatios    []float64 `json:"pair_ratios"`
	ReqPerSec     float64   `json:"req_per_sec_median"`
	BareReqPerSec float64   `json:"bare_req_per_sec_median"`
	P50Ms         float64   `json:"p50_ms_median"`
	P99Ms         float64   `json:"p99_ms_median"`
	S2xx          uint64    `json:"status_2xx"`
	S429          uint64    `json:"status_429"`
	Errors        uint64    `json:"errors"` // transport errors + other statuses
	// Caddy's CPU time per response over the site's runs, and over the
	// bare runs of the same pairs.
	CaddyCPUUsPerReq     *float64 `json:"caddy_cpu_us_per_req,omitempty"`
	BareCaddyCPUUsPerReq *float64 `json:"bare_caddy_cpu_us_per_req,omitempty"`
	// Redis figures over the site's runs (absent for sites without Redis).
	RedisCalls        *int64    `json:"redis_script_calls,omitempty"`
	RedisCallsPerReq  *float64  `json:"redis_calls_per_req,omitempty"`
	RedisCallsPer429  *float64  `json:"redis_calls_per_denied_req,omitempty"`
	RedisCPUUsPerReq  *float64  `json:"redis_cpu_us_per_req,omitempty"`
	RedisCPUUsPerCall *float64  `json:"redis_cpu_us_per_call,omitempty"`
	ScriptUsPerCall   *float64  `json:"script_us_per_call,omitempty"`
	ScriptUsPerReq    *float64  `json:"script_us_per_req,omitempty"`
	XTrivial          *float64  `json:"script_us_per_req_x_trivial_eval,omitempty"`
	Fill              *fillJSON `json:"fill,omitempty"`
	// CaddyErrors counts error lines in Caddy's log during the site's runs.
	CaddyErrors int    `json:"caddy_error_log_lines,omitempty"`
	CaddyError  string `json:"caddy_first_error,omitempty"`
	LastErr     string `json:"last_transport_error,omitempty"`
}

type fillJSON struct {
	Seconds   float64 `json:"seconds"`
	Responses uint64  `json:"responses"`
	Share429  float64 `json:"last_step_share_429"`
	Reached   bool    `json:"at_limit"`
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

func ptr[T any](v T) *T { return &v }

func buildReport(b *bench, layouts []*layoutResult, micro *microResult) *report {
	rep := &report{
		Machine: machineInfo(b),
		Config: reportConfig{
			Pairs: b.o.pairs, PairDurationS: b.o.pairDuration.Seconds(), WarmupS: b.o.warmup.Seconds(),
			Conns: b.o.conns, Keys: b.o.keys,
		},
		Micro: micro,
	}
	for _, lr := range layouts {
		rep.Layouts = append(rep.Layouts, layoutReportOf(lr, runtime.NumCPU()))
	}
	for _, s := range allSites {
		if reason, ok := b.skipped[s.Name]; ok {
			rep.Skipped = append(rep.Skipped, skippedSite{Site: s.Name, Reason: reason})
		}
	}
	return rep
}

func layoutReportOf(lr *layoutResult, ncpu int) layoutReport {
	l := lr.Layout
	out := layoutReport{Name: l.Name, Description: l.describe(ncpu), Verified: lr.Verified, TrivialErr: lr.TrivialErr,
		Harness: lr.Harness.Name, HarnessDesc: lr.Harness.describe(), Conns: lr.Harness.Conns}
	if l.pinned() {
		out.CaddyCPU, out.LoadCPU = ptr(l.CaddyCPU), ptr(l.LoadCPU)
	}
	if t := lr.Trivial; t != nil {
		out.Trivial = &trivialJSON{Calls: t.Calls, Pipeline: t.Pipeline, UsPerCall: t.UsecPerCall, CPUUsPerCal: us(t.CPUPerCall)}
	}
	for _, sr := range lr.Sites {
		out.Sites = append(out.Sites, siteReportOf(sr, lr.Trivial))
	}
	if half := lr.Half; half != nil && len(half.Sites) == 2 {
		h := &halfLoadReport{TargetReqPerSec: half.Rate, Generator: "go (open loop, paced)"}
		for _, s := range half.Sites {
			h.Sites = append(h.Sites, halfLoadJSON{
				Site: s.Name, ReqPerSec: s.Achieved, P50Ms: ms(s.P50), P99Ms: ms(s.P99),
				SchedP99Ms: ms(s.SchedP99), Non2xx: s.Non2xx, Errors: s.Errors,
			})
		}
		h.P99AddedMs = ms(half.Sites[1].P99 - half.Sites[0].P99)
		h.SchedP99AddedMs = ms(half.Sites[1].SchedP99 - half.Sites[0].SchedP99)
		out.HalfLoad = h
	}
	return out
}

func siteReportOf(sr siteResult, triv *trivial) siteReport {
	sm := summarize(sr.Pairs)
	out := siteReport{
		Site: sr.Site.Name, Description: sr.Site.Desc, Generator: sm.Generator,
		ReqPerSec: sm.ReqPerSec, BareReqPerSec: sm.BareReqPerSec, P50Ms: ms(sm.P50), P99Ms: ms(sm.P99),
		S2xx: sm.S2xx, S429: sm.S429, Errors: sm.Errors,
		CaddyErrors: sm.CaddyErrors, CaddyError: sm.CaddyError, LastErr: sm.LastErr,
	}
	for _, p := range sr.Pairs {
		r, ok := p.ratio()
		if !ok {
			r = math.NaN()
		}
		out.PairRatios = append(out.PairRatios, r)
	}
	if slices.ContainsFunc(out.PairRatios, math.IsNaN) {
		out.PairRatios = nil // JSON has no NaN; Ratio still summarizes the valid ones
	}
	if sm.RatioOK {
		out.Ratio = ptr(sm.Ratio)
	}
	if sm.CaddyCPUPerReq > 0 {
		out.CaddyCPUUsPerReq = ptr(us(sm.CaddyCPUPerReq))
	}
	if sm.BareCaddyCPUPerReq > 0 {
		out.BareCaddyCPUUsPerReq = ptr(us(sm.BareCaddyCPUPerReq))
	}
	if sr.Site.Redis && sm.RedisOK {
		out.RedisCalls = ptr(sm.RedisCalls)
		if v, ok := sm.callsPerReq(); ok {
			out.RedisCallsPerReq = ptr(v)
		}
		if sm.S429 > 0 {
			out.RedisCallsPer429 = ptr(float64(sm.RedisCalls) / float64(sm.S429))
		}
		if v, ok := sm.redisCPUPerReq(); ok {
			out.RedisCPUUsPerReq = ptr(us(v))
		}
		if v, ok := sm.redisCPUPerCall(); ok {
			out.RedisCPUUsPerCall = ptr(us(v))
		}
		if v, ok := sm.scriptUsecPerCall(); ok {
			out.ScriptUsPerCall = ptr(v)
		}
		if v, ok := sm.scriptUsecPerReq(); ok {
			out.ScriptUsPerReq = ptr(v)
			if triv != nil && triv.UsecPerCall > 0 {
				out.XTrivial = ptr(v / triv.UsecPerCall)
			}
		}
	}
	if f := sr.Fill; f != nil {
		out.Fill = &fillJSON{Seconds: f.Elapsed.Seconds(), Responses: f.Responses, Share429: f.Share429, Reached: f.Reached}
	}
	return out
}

// cell formats an optional figure, "–" when absent.
func cell[T any](v *T, format string) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf(format, *v)
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
	fmt.Fprintf(w, "Load: %s; %d connections, %d keys (hot_* sites: 1 key, redis_log_100/10000: %d keys), loopback.\n",
		mc.Generator, rep.Config.Conns, rep.Config.Keys, fillKeys)
	fmt.Fprintf(w, "Each site: %gs warm-up, then %d pairs of a %gs site run and a %gs bare-Caddy run (site `none`), alternating which goes first. "+
		"ratio = the median of the pairs' site req/s ÷ bare req/s (min–max of the pairs in brackets); req/s, p50 and p99 are medians of the site's runs; "+
		"CPU and Redis figures are totals over the site's runs divided by its requests or script calls. See docs/bench.md.\n",
		rep.Config.WarmupS, rep.Config.Pairs, rep.Config.PairDurationS, rep.Config.PairDurationS)
	if mc.LayoutNote != "" {
		fmt.Fprintf(w, "**%s.**\n", mc.LayoutNote)
	}

	for _, l := range rep.Layouts {
		printLayout(w, l)
	}
	printHarnesses(w, rep)

	if len(rep.Skipped) > 0 {
		fmt.Fprintln(w, "\nSkipped (this Caddy build rejects their config):")
		for _, s := range rep.Skipped {
			fmt.Fprintf(w, "- %s: %s\n", s.Site, s.Reason)
		}
	}

	if m := rep.Micro; m != nil {
		fmt.Fprintf(w, "\n### Handler micro-benchmark (`%s`)\n\n", m.Command)
		if m.Err != "" {
			fmt.Fprintf(w, "allocs/op: n/a (%s)\n", m.Err)
		}
		if len(m.Benches) > 0 {
			if m.Err != "" {
				fmt.Fprintln(w)
			}
			fmt.Fprintln(w, "| benchmark | ns/op | B/op | allocs/op |")
			fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
			for _, b := range m.Benches {
				allocs := cellOr(b.AllocsPerOp, "%.0f", "n/a")
				if b.Failed != "" {
					allocs = "n/a (failed: " + b.Failed + ")"
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s |\n", b.Name, cellOr(b.NsPerOp, "%.0f", "n/a"), cellOr(b.BytesPerOp, "%.0f", "n/a"), allocs)
			}
		}
	}
	fmt.Fprintln(w)
}

func cellOr[T any](v *T, format, none string) string {
	if v == nil {
		return none
	}
	return fmt.Sprintf(format, *v)
}

func printLayout(w io.Writer, l layoutReport) {
	if l.Harness == "" || l.Harness == "bench" {
		fmt.Fprintf(w, "\n### Layout %s: %s\n\n", l.Name, l.Description)
	} else {
		fmt.Fprintf(w, "\n### Layout %s, harness %s: %s\n\n", l.Name, l.Harness, l.Description)
	}
	if l.HarnessDesc != "" {
		fmt.Fprintf(w, "Harness %s: %s.\n", l.Harness, l.HarnessDesc)
	}
	if l.Verified != "" {
		fmt.Fprintf(w, "Pinning %s.\n", l.Verified)
	}
	if t := l.Trivial; t != nil {
		fmt.Fprintf(w, "Trivial-script baseline (same redis-server, same layout): `EVAL \"return 1\" 0` costs %.2f µs per call in INFO commandstats "+
			"(%.2f µs of Redis CPU per call over the burst: %d calls pipelined %d deep). \"× trivial\" below is script µs/req ÷ %.2f.\n",
			t.UsPerCall, t.CPUUsPerCal, t.Calls, t.Pipeline, t.UsPerCall)
	} else if l.TrivialErr != "" {
		fmt.Fprintf(w, "Trivial-script baseline: n/a (%s).\n", l.TrivialErr)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| site | ratio to bare | req/s | p50 | p99 | 2xx | 429 | errors | Caddy CPU µs/req (vs bare) | Redis calls/req | Redis CPU µs/req | Redis CPU µs/call | script µs/req | × trivial |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, s := range l.Sites {
		ratio := "n/a"
		if s.Ratio != nil {
			ratio = fmt.Sprintf("**%.2f** (%.2f–%.2f)", s.Ratio.Median, s.Ratio.Min, s.Ratio.Max)
		}
		caddy := "n/a"
		if s.CaddyCPUUsPerReq != nil {
			caddy = fmt.Sprintf("%.1f", *s.CaddyCPUUsPerReq)
			if s.BareCaddyCPUUsPerReq != nil {
				caddy += fmt.Sprintf(" (%+.1f)", *s.CaddyCPUUsPerReq-*s.BareCaddyCPUUsPerReq)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.2f ms | %.2f ms | %d | %d | %d | %s | %s | %s | %s | %s | %s |\n",
			s.Site, ratio, s.ReqPerSec, s.P50Ms, s.P99Ms, s.S2xx, s.S429, s.Errors, caddy,
			cell(s.RedisCallsPerReq, "%.3f"), cell(s.RedisCPUUsPerReq, "%.1f"), cell(s.RedisCPUUsPerCall, "%.1f"),
			cell(s.ScriptUsPerReq, "%.2f"), cell(s.XTrivial, "%.1f×"))
	}

	var notes []string
	for _, s := range l.Sites {
		if f := s.Fill; f != nil {
			state := "its keys held at their limit"
			if !f.Reached {
				state = "**not at its limit** (raise -fill-max): sets smaller than the limit"
			}
			notes = append(notes, fmt.Sprintf("- %s: filled for %.1fs (%d responses, %.0f%% 429 at the end): %s", s.Site, f.Seconds, f.Responses, 100*f.Share429, state))
		}
		if strings.HasPrefix(s.Site, "hot_") && s.RedisCallsPer429 != nil {
			cache := "deny cache on"
			if strings.HasSuffix(s.Site, "_nocache") {
				cache = "deny cache off"
			}
			notes = append(notes, fmt.Sprintf("- %s: %d Redis script calls, **%.4f per denied request** (%d denied), %s", s.Site, *s.RedisCalls, *s.RedisCallsPer429, s.S429, cache))
		}
		if s.CaddyErrors > 0 {
			notes = append(notes, fmt.Sprintf("- %s: Caddy logged %d error lines (its logging is rate limited), first: %s", s.Site, s.CaddyErrors, s.CaddyError))
		}
		if s.Errors > 0 && s.LastErr != "" {
			notes = append(notes, fmt.Sprintf("- %s: %d errors, last transport error: %s", s.Site, s.Errors, s.LastErr))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}

	if h := l.HalfLoad; h != nil {
		fmt.Fprintf(w, "\np99 added at half load: open loop at %.0f req/s (half of redis_log's median), %s:\n", h.TargetReqPerSec, h.Generator)
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
}

func machineInfo(b *bench) machine {
	m := machine{
		NProc:      nproc(),
		CPU:        cpuModel(),
		Go:         goVersion(),
		OSArch:     runtime.GOOS + "/" + runtime.GOARCH,
		Date:       time.Now().Format("2006-01-02 15:04 MST"),
		Generator:  b.genDesc,
		LoadAvg:    b.loadAvg,
		LayoutNote: b.layoutNote,
	}
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(k))
	}
	if b.redisUsed {
		m.Redis = redisVersion()
	}
	return m
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

// printHarnesses prints, when the run measured the pinned layout in more
// than one harness setting, each site's ratio to bare in each, side by
// side (the same run, the same Caddy binary).
func printHarnesses(w io.Writer, rep *report) {
	var pinned []layoutReport
	for _, l := range rep.Layouts {
		if l.Name == "pinned" {
			pinned = append(pinned, l)
		}
	}
	if len(pinned) < 2 {
		return
	}
	fmt.Fprintf(w, "\n### Pinned, both harness settings (ratio to bare, median of the pairs)\n\n| site |")
	for _, l := range pinned {
		fmt.Fprintf(w, " %s |", l.Harness)
	}
	fmt.Fprintf(w, "\n| --- |%s\n", strings.Repeat(" ---: |", len(pinned)))
	var names []string
	for _, l := range pinned {
		for _, s := range l.Sites {
			if !slices.Contains(names, s.Site) {
				names = append(names, s.Site)
			}
		}
	}
	for _, name := range names {
		fmt.Fprintf(w, "| %s |", name)
		for _, l := range pinned {
			cell := "–"
			for _, s := range l.Sites {
				if s.Site == name && s.Ratio != nil {
					cell = fmt.Sprintf("%.2f (%.2f–%.2f)", s.Ratio.Median, s.Ratio.Min, s.Ratio.Max)
				}
			}
			fmt.Fprintf(w, " %s |", cell)
		}
		fmt.Fprintln(w)
	}
}
