package main

import (
	"time"
)

// trace is the viral trace of issue #21, in real (scaled) time: every data
// centre flat at flat requests a second, but the last one (the viral one),
// which goes from flat to high in ramp after warm and stays there until
// the end. Rates are in requests per second of real time.
type trace struct {
	dcs              int
	flat, high       float64
	warm, ramp, hold time.Duration
}

// viral is the index of the viral data centre.
func (tr trace) viral() int { return tr.dcs - 1 }

// total is the trace's length.
func (tr trace) total() time.Duration { return tr.warm + tr.ramp + tr.hold }

// rate is data centre dc's demand at t (requests per second).
func (tr trace) rate(dc int, t time.Duration) float64 {
	if dc != tr.viral() || t < tr.warm {
		return tr.flat
	}
	if t < tr.warm+tr.ramp {
		return tr.flat + (tr.high-tr.flat)*float64(t-tr.warm)/float64(tr.ramp)
	}
	return tr.high
}

// cum is data centre dc's demand from 0 to t (requests).
func (tr trace) cum(dc int, t time.Duration) float64 {
	s := t.Seconds()
	if dc != tr.viral() || t < tr.warm {
		return tr.flat * s
	}
	w, r := tr.warm.Seconds(), tr.ramp.Seconds()
	if t < tr.warm+tr.ramp {
		x := s - w
		return tr.flat*s + (tr.high-tr.flat)*x*x/(2*r)
	}
	return tr.flat*(w+r) + (tr.high-tr.flat)*r/2 + tr.high*(s-w-r)
}

// arrival is the time of data centre dc's n-th request (from 0): where its
// demand reaches n + 1/2, so arrivals are spread evenly at the rate.
func (tr trace) arrival(dc, n int) (time.Duration, bool) {
	want := float64(n) + 0.5
	lo, hi := time.Duration(0), tr.total()
	if tr.cum(dc, hi) < want {
		return 0, false
	}
	for hi-lo > time.Microsecond {
		mid := lo + (hi-lo)/2
		if tr.cum(dc, mid) < want {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, true
}

// totalRate is every data centre's demand at t.
func (tr trace) totalRate(t time.Duration) float64 {
	var s float64
	for dc := range tr.dcs {
		s += tr.rate(dc, t)
	}
	return s
}

// overDemand is when the total demand first exceeds ceiling (requests per
// second): the over-demand phase runs from then to the end (false: never).
func (tr trace) overDemand(ceiling float64) (time.Duration, bool) {
	for t := time.Duration(0); t < tr.total(); t += time.Millisecond {
		if tr.totalRate(t) > ceiling {
			return t, true
		}
	}
	return 0, false
}

func timeDuration(i int) time.Duration { return time.Duration(i) }
