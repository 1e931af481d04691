package main

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// spread is a median with its range.
type spread struct{ Med, Min, Max float64 }

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

// format prints the median and, with more than one value, the range.
func (s spread) format(f string) string {
	if s.Min == s.Max {
		return fmt.Sprintf(f, s.Med)
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", s.Med, s.Min, s.Max)
}

// column is every run of service i, in every pair and round.
func column(sr settingResult, i int, f func(runResult) float64) []float64 {
	var out []float64
	for _, rr := range sr.Rounds {
		for k, pr := range sr.Pairs {
			if pr.A == i {
				out = append(out, f(rr[k].A))
			}
			if pr.B == i && pr.B != pr.A {
				out = append(out, f(rr[k].B))
			}
		}
	}
	return out
}

// ratios is f(A)/f(B) of the pair (i, j), round by round: a pair's two
// runs are back to back, so the machine's drift cancels.
func ratios(sr settingResult, i, j int, f func(runResult) float64) []float64 {
	var out []float64
	for _, rr := range sr.Rounds {
		for k, pr := range sr.Pairs {
			if pr.A == i && pr.B == j {
				if b := f(rr[k].B); b > 0 {
					out = append(out, f(rr[k].A)/b)
				}
			}
		}
	}
	return out
}

func sum(v []float64) (s float64) {
	for _, x := range v {
		s += x
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
func us(d time.Duration) float64 { return float64(d) / 1e3 }

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.2f ms", ms(d)) }

func printReport(w io.Writer, rep *report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("### Envoy's rate limit service: cmd/rls beside envoyproxy/ratelimit (`go run ./cmd/rlsbench`)")
	p("")
	p("Run: %s UTC. Machine: %s.", rep.Date.Format("2006-01-02 15:04"), rep.Machine)
	p("Services: %s; %s; %s.", rep.Ours, rep.Envoy, rep.Redis)
	p("Config: one descriptor `key`, every value counted apart, %d a minute (fixed window; ours also sliding_log);"+
		" each check one descriptor of %d values at random, hits_addend 1, closed loop over gRPC on loopback.", rep.Limit, rep.Keys)
	p("Each setting: %d rounds, each a pair of %v runs back to back of each of ours with each envoyproxy/ratelimit,"+
		" ours first in every other pair; a value is the median of the runs (min–max), a ratio the median of the pairs' ratios.",
		rep.Rounds, rep.Run)
	p("CPU per check: the service's (/proc/PID/stat, all its threads) and redis-server's (INFO cpu), over the run.")
	envoy := -1
	for i, s := range rep.Services {
		if s.Envoy && envoy < 0 {
			envoy = i
		}
	}
	for _, sr := range rep.Settings {
		p("")
		p("#### %s", sr.Setting)
		p("")
		p("| service | checks/s | p50 | p99 | service CPU/check | Redis CPU/check | OVER_LIMIT | errors |")
		p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for i, s := range rep.Services {
			checks := sum(column(sr, i, func(r runResult) float64 { return float64(r.Checks) }))
			over := sum(column(sr, i, func(r runResult) float64 { return float64(r.Over) }))
			errs := sum(column(sr, i, func(r runResult) float64 { return float64(r.Errors) }))
			overShare := 0.0
			if checks > 0 {
				overShare = 100 * over / checks
			}
			p("| %s | %s | %s ms | %s ms | %s µs | %s µs | %.1f %% | %.0f |", s.Name,
				spreadOf(column(sr, i, runResult.perSec)).format("%.0f"),
				spreadOf(column(sr, i, func(r runResult) float64 { return ms(r.P50) })).format("%.2f"),
				spreadOf(column(sr, i, func(r runResult) float64 { return ms(r.P99) })).format("%.2f"),
				spreadOf(column(sr, i, func(r runResult) float64 { return us(r.cpuPerCheck(r.ServiceCPU)) })).format("%.1f"),
				spreadOf(column(sr, i, func(r runResult) float64 { return us(r.cpuPerCheck(r.RedisCPU)) })).format("%.1f"),
				overShare, errs)
		}
		if envoy < 0 {
			p("")
			p("No ratio: %s", envoyAbsent)
			continue
		}
		p("")
		p("| ours | to | checks/s ratio | p99 ratio (lower: ours faster) | CPU/check ratio, service + Redis (lower: ours cheaper) |")
		p("| --- | --- | ---: | ---: | ---: |")
		for _, pr := range sr.Pairs {
			p("| %s | %s | %s | %s | %s |", rep.Services[pr.A].Name, rep.Services[pr.B].Name,
				spreadOf(ratios(sr, pr.A, pr.B, runResult.perSec)).format("%.2f"),
				spreadOf(ratios(sr, pr.A, pr.B, func(r runResult) float64 { return ms(r.P99) })).format("%.2f"),
				spreadOf(ratios(sr, pr.A, pr.B, func(r runResult) float64 { return us(r.cpuPerCheck(r.ServiceCPU + r.RedisCPU)) })).format("%.2f"))
		}
	}
	p("")
	for _, s := range rep.Services {
		p("- %s: %s.", s.Name, s.Desc)
	}
}
