package main

import (
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram in nanoseconds (HDR-like): values
// below 128ns are exact, larger ones fall in one of 64 buckets per power of
// two, so a reported value is within about 1.6% of the true one. Values are
// capped at about 18 minutes. Not safe for concurrent use: each load
// generator goroutine has its own and they are merged at the end.
type hist struct {
	counts [histBuckets]uint64
	total  uint64
	max    int64
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits // buckets per power of two
	histMaxBits = 40               // 2^40ns ~ 18min
	histBuckets = (histMaxBits-histSubBits+1)*histSub + histSub
)

func histIndex(v int64) int {
	if v < 0 {
		v = 0
	}
	if v >= 1<<histMaxBits {
		v = 1<<histMaxBits - 1
	}
	u := uint64(v)
	if u < 2*histSub {
		return int(u)
	}
	shift := bits.Len64(u) - (histSubBits + 1)
	return shift*histSub + int(u>>shift)
}

// histValue is the midpoint of bucket i.
func histValue(i int) int64 {
	if i < 2*histSub {
		return int64(i)
	}
	shift := i/histSub - 1
	m := int64(i%histSub + histSub)
	lo := m << shift
	hi := (m+1)<<shift - 1
	return (lo + hi) / 2
}

func (h *hist) record(d time.Duration) {
	h.counts[histIndex(int64(d))]++
	h.total++
	if int64(d) > h.max {
		h.max = int64(d)
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// quantile returns the latency at quantile q in [0, 1] (0 when empty).
func (h *hist) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q*float64(h.total) + 0.999999)
	rank = min(max(rank, 1), h.total)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return time.Duration(min(histValue(i), h.max))
		}
	}
	return time.Duration(h.max)
}
