package main

import (
	"slices"
	"sort"
	"time"
)

// times returns the admission times (µs after the start) of the records
// that pass keep, sorted.
func times(recs []record, keep func(r record) bool) []int64 {
	var s []int64
	for _, r := range recs {
		if r.pass && keep(r) {
			s = append(s, r.at)
		}
	}
	slices.Sort(s)
	return s
}

// count is the number of s (sorted) in [from, to).
func count(s []int64, from, to int64) int {
	return sort.Search(len(s), func(i int) bool { return s[i] >= to }) - sort.Search(len(s), func(i int) bool { return s[i] >= from })
}

// overAdmitted is the most admissions in any trailing window of length
// win (µs), less limit (0 or less: the ceiling held), and the end of that
// window.
func overAdmitted(at []int64, win, limit int64) (over, when int64) {
	var most int64
	j := 0
	for i := range at {
		for at[j]+win <= at[i] {
			j++
		}
		if n := int64(i - j + 1); n > most {
			most, when = n, at[i]
		}
	}
	return most - limit, when
}

// underUse is, for every window of length win starting at from, from+step,
// ... and ending by end, 1 - admitted/limit: its worst (largest), median
// and the number of windows.
type underUse struct {
	Worst, Median float64
	WorstAt       int64 // the worst window's start, µs
	Windows       int
}

func measureUnderUse(at []int64, from, end, win, step, limit int64) underUse {
	var u []float64
	var worstAt int64
	worst := -1.0
	for s := from; s+win <= end; s += step {
		v := 1 - float64(count(at, s, s+win))/float64(limit)
		u = append(u, v)
		if v > worst {
			worst, worstAt = v, s
		}
	}
	if len(u) == 0 {
		return underUse{}
	}
	slices.Sort(u)
	return underUse{Worst: worst, Median: u[len(u)/2], WorstAt: worstAt, Windows: len(u)}
}

// follow is the share follow time: see the output's definition
// (describeFollow).
type follow struct {
	Lag     time.Duration // the worst lag
	At      time.Duration // the demand's time of the worst lag
	Bounded bool          // the admitted rate never reached the target before full: Lag is a lower bound
	Full    time.Duration // when the ceiling was first 90 % used (the end of the measure)
	Points  int
}

const (
	followSpan  = 500 * time.Millisecond // rates are averaged over this trailing span
	followStep  = 50 * time.Millisecond
	followShare = 0.95
	fullShare   = 0.90
)

// measureFollow measures how long the viral data centre's admitted rate
// lags its target: the lesser of its demand and its max-min fair rate
// (fair, requests per second), from the ramp's start until the ceiling is
// first fullShare used (all, every admission; viral, the viral data
// centre's).
func measureFollow(tr trace, all, viral []int64, win, limit int64, fair float64) follow {
	span := followSpan.Microseconds()
	full := tr.total()
	for t := tr.warm; t < tr.total(); t += 10 * time.Millisecond {
		us := t.Microseconds()
		if float64(count(all, us-win+1, us+1)) >= fullShare*float64(limit) {
			full = t
			break
		}
	}
	admitted := func(t time.Duration) float64 {
		us := t.Microseconds()
		return float64(count(viral, us-span+1, us+1)) / followSpan.Seconds()
	}
	v := tr.viral()
	f := follow{Full: full, At: tr.warm}
	for t := tr.warm; t <= min(tr.warm+tr.ramp, full); t += followStep {
		demand := (tr.cum(v, t) - tr.cum(v, t-followSpan)) / followSpan.Seconds()
		target := followShare * min(demand, fair)
		lag, found := time.Duration(0), false
		for ; t+lag <= full; lag += followStep {
			if admitted(t+lag) >= target {
				found = true
				break
			}
		}
		if !found {
			lag = full - t
		}
		f.Points++
		if lag > f.Lag || (!found && lag == f.Lag) {
			f.Lag, f.At, f.Bounded = lag, t, !found
		}
	}
	return f
}

// maxMinFair is the max-min fair split of capacity among demands (water
// filling): no one gets more than it asks, and what one leaves goes to the
// others equally.
func maxMinFair(demands []float64, capacity float64) []float64 {
	out := make([]float64, len(demands))
	left := capacity
	open := make([]int, 0, len(demands))
	for i := range demands {
		open = append(open, i)
	}
	for len(open) > 0 && left > 1e-9 {
		share := left / float64(len(open))
		var next []int
		gave := 0.0
		for _, i := range open {
			need := demands[i] - out[i]
			if need <= share {
				out[i] += need
				gave += need
			} else {
				next = append(next, i)
			}
		}
		if len(next) == len(open) {
			for _, i := range open {
				out[i] += share
			}
			break
		}
		left -= gave
		open = next
	}
	return out
}

// percentile is the q-th quantile of sorted s.
func percentile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[int(q*float64(len(s)-1)+0.5)]
}

// latencies returns the Decide time of the decisions keep keeps, sorted.
func latencies(recs []record, keep func(record) bool) []time.Duration {
	s := make([]time.Duration, 0, len(recs))
	for _, r := range recs {
		if keep(r) {
			s = append(s, r.took)
		}
	}
	slices.Sort(s)
	return s
}
