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

// column is one value of every round of service i.
func column(sr settingResult, i int, f func(runResult) float64) []float64 {
	var out []float64
	for _, rr := range sr.Rounds {
		out = append(out, f(rr[i]))
	}
	return out
}

// ratios is a/b of service i to service j, round by round (the same
// round: the machine's drift cancels).
func ratios(sr settingResult, i, j int, f func(runResult) float64) []float64 {
	var out []float64
	for _, rr := range sr.Rounds {
		if b := f(rr[j]); b > 0 {
			out = append(out, f(rr[i])/b)
		}
	}
	return out
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
	p("Each setting: %d rounds, each a %v run of every service, the order reversed every other round;"+
		" a value is the median of the rounds (min–max), a ratio the median of the rounds' ratios (same round).", rep.Rounds, rep.Run)
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
			var checks, over, errs uint64
			for _, rr := range sr.Rounds {
				checks, over, errs = checks+rr[i].Checks, over+rr[i].Over, errs+rr[i].Errors
			}
			overShare := 0.0
			if checks > 0 {
				overShare = 100 * float64(over) / float64(checks)
			}
			p("| %s | %s | %s ms | %s ms | %s µs | %s µs | %.1f %% | %d |", s.Name,
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
		p("| ours | to | checks/s ratio | p99 ratio (lower: ours faster) |")
		p("| --- | --- | ---: | ---: |")
		for i, s := range rep.Services {
			if s.Envoy {
				continue
			}
			for j, e := range rep.Services {
				if !e.Envoy {
					continue
				}
				p("| %s | %s | %s | %s |", s.Name, e.Name,
					spreadOf(ratios(sr, i, j, runResult.perSec)).format("%.2f"),
					spreadOf(ratios(sr, i, j, func(r runResult) float64 { return ms(r.P99) })).format("%.2f"))
			}
		}
	}
	p("")
	for _, s := range rep.Services {
		p("- %s: %s.", s.Name, s.Desc)
	}
}
