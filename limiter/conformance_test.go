package limiter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// t0 is the conformance table's origin; every case runs on an injected clock.
// It is 1 s before the start of a minute (and so of a 2 s or 10 s window).
var t0 = time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC)

// b0 is the offset of the first window boundary after t0.
const b0 = time.Second

// step is one request of a conformance case and what it must get.
type step struct {
	at     time.Duration // offset from t0
	region string        // "" uses the case's default region
	cost   int64
	peek   bool
	n      int // repeat the step n times (0 means 1); expectations apply to the last

	allowed   bool
	banned    bool
	count     int64   // the first window's count after the request; -1 skips the check
	counts    []int64 // every bucket window's count, when set
	retry     time.Duration
	global    int64 // global count after the request, when the case has one; -1 skips
	globalDen bool
	reset     time.Duration // the first window's reset, checked when chkReset
	chkReset  bool
}

type confCase struct {
	name        string
	alg         limiter.Algorithm
	limit       int64
	burst       int64 // token_bucket capacity; 0 means limit
	window      time.Duration
	windows     []limiter.Window // several windows (limits in limits), instead of limit and window
	limits      []int64
	region      bool
	globalLimit int64
	ban         *limiter.Ban
	steps       []step
}

var conformance = []confCase{
	{
		// DESIGN.md's window-boundary case: a fixed window would admit again
		// at t+1s; the sliding log must not, until t+60.000001s.
		name: "sliding_log/window boundary", alg: limiter.SlidingLog, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100},
			{at: 0, allowed: false, count: 100, retry: time.Minute},
			{at: time.Second, allowed: false, count: 100, retry: 59 * time.Second},
			{at: time.Minute - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: time.Minute + time.Microsecond, allowed: true, count: 1},
			{at: time.Minute + time.Microsecond, n: 99, allowed: true, count: 100},
			{at: time.Minute + 2*time.Microsecond, allowed: false, count: 100, retry: time.Minute - time.Microsecond},
		},
	},
	{
		name: "sliding_log/slides entry by entry", alg: limiter.SlidingLog, limit: 3, window: 10 * time.Second,
		steps: []step{
			{at: 0, allowed: true, count: 1},
			{at: 2 * time.Second, allowed: true, count: 2},
			{at: 4 * time.Second, allowed: true, count: 3},
			{at: 5 * time.Second, allowed: false, count: 3, retry: 5 * time.Second},
			{at: 10 * time.Second, allowed: true, count: 3}, // t0's entry is exactly one window old: out
			{at: 11 * time.Second, allowed: false, count: 3, retry: time.Second},
			{at: 12 * time.Second, allowed: true, count: 3},
		},
	},
	{
		name: "sliding_log/rejections are not recorded", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, n: 2, allowed: true, count: 2},
			{at: 1 * time.Second, n: 50, allowed: false, count: 2, retry: 9 * time.Second},
			{at: 10 * time.Second, n: 2, allowed: true, count: 2},
		},
	},
	{
		name: "sliding_log/cost", alg: limiter.SlidingLog, limit: 10, window: 10 * time.Second,
		steps: []step{
			{at: 0, cost: 4, allowed: true, count: 4},
			{at: time.Second, cost: 4, allowed: true, count: 8},
			{at: 2 * time.Second, cost: 4, allowed: false, count: 8, retry: 8 * time.Second},
			{at: 2 * time.Second, cost: 2, allowed: true, count: 10},
			{at: 10 * time.Second, cost: 4, allowed: true, count: 10},
		},
	},
	{
		// One member per request carries its cost: room for a cost comes
		// when enough units (not entries) have left.
		name: "sliding_log/mixed costs leave by request", alg: limiter.SlidingLog, limit: 10, window: 10 * time.Second,
		steps: []step{
			{at: 0, cost: 4, allowed: true, count: 4, reset: 10 * time.Second, chkReset: true},
			{at: time.Second, cost: 1, allowed: true, count: 5},
			{at: 2 * time.Second, cost: 3, allowed: true, count: 8},
			// 2 units must leave: the request of 4 at t0 does, at 10 s.
			{at: 3 * time.Second, cost: 4, allowed: false, count: 8, retry: 7 * time.Second},
			{at: 3 * time.Second, cost: 2, allowed: true, count: 10},
			{at: 10 * time.Second, cost: 4, allowed: true, count: 10, reset: time.Second, chkReset: true},
			// 1 unit must leave: the request of 1 at 1 s.
			{at: 10 * time.Second, cost: 1, allowed: false, count: 10, retry: time.Second},
		},
	},
	{
		name: "sliding_log/a cost of a million", alg: limiter.SlidingLog, limit: 3_000_000, window: time.Minute,
		steps: []step{
			{at: 0, cost: 1_000_000, n: 3, allowed: true, count: 3_000_000},
			{at: time.Second, cost: 1, allowed: false, count: 3_000_000, retry: 59 * time.Second},
			{at: time.Minute, cost: 2_000_000, allowed: true, count: 2_000_000},
		},
	},
	{
		name: "sliding_log/peek records nothing", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, peek: true, n: 5, allowed: true, count: 0},
			{at: 0, allowed: true, count: 1},
			{at: 0, peek: true, allowed: true, count: 1},
			{at: 0, allowed: true, count: 2},
			{at: time.Second, peek: true, allowed: false, count: 2, retry: 9 * time.Second},
		},
	},
	{
		name: "sliding_log/regions are independent", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second, region: true,
		steps: []step{
			{at: 0, region: "us", n: 2, allowed: true, count: 2},
			{at: 0, region: "us", allowed: false, count: 2, retry: 10 * time.Second},
			{at: 0, region: "gb", allowed: true, count: 1},
		},
	},
	{
		// Region limit 5, global 7. The global denial leaves gb's bucket
		// untouched, the region denial leaves the global alone.
		name: "sliding_log/global ceiling", alg: limiter.SlidingLog, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: 0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: 0, region: "us", allowed: false, count: 5, global: 5, retry: 10 * time.Second},
			{at: time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			{at: 2 * time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: 2 * time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: 10 * time.Second, region: "gb", allowed: true, count: 3, global: 3},
			{at: 11 * time.Second, region: "us", n: 4, allowed: true, count: 4, global: 5},
		},
	},
	{
		// 2 per second and 3 per 10 s on one log: a request must fit both,
		// and one denied by either is recorded in neither.
		name: "sliding_log/several windows", alg: limiter.SlidingLog,
		windows: []limiter.Window{{Duration: time.Second}, {Duration: 10 * time.Second}}, limits: []int64{2, 3},
		steps: []step{
			{at: 0, n: 2, allowed: true, counts: []int64{2, 2}, count: -1},
			{at: 0, allowed: false, counts: []int64{2, 2}, count: -1, retry: time.Second},
			{at: time.Second, allowed: true, counts: []int64{1, 3}, count: -1},
			// The 10 s window is full; t0's first entry leaves it at 10 s.
			{at: 1500 * time.Millisecond, allowed: false, counts: []int64{1, 3}, count: -1, retry: 8500 * time.Millisecond},
			{at: 10 * time.Second, allowed: true, counts: []int64{1, 2}, count: -1},
		},
	},
	{
		// Three denials within 5 s ban the key for 20 s: every request is
		// then denied with the ban's time left (or the window's, when
		// longer), and requests made while banned do not lengthen it.
		name: "sliding_log/penalty box", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second,
		ban: &limiter.Ban{After: 3, Within: 5 * time.Second, For: 20 * time.Second},
		steps: []step{
			{at: 0, n: 2, allowed: true, count: 2},
			{at: time.Second, allowed: false, count: 2, retry: 9 * time.Second},
			{at: 2 * time.Second, allowed: false, count: 2, retry: 8 * time.Second},
			{at: 3 * time.Second, allowed: false, banned: true, count: 2, retry: 20 * time.Second},
			{at: 4 * time.Second, n: 30, allowed: false, banned: true, count: 2, retry: 19 * time.Second},
			{at: 10 * time.Second, allowed: false, banned: true, count: 0, retry: 13 * time.Second},
			{at: 23 * time.Second, allowed: true, count: 1},
		},
	},

	// ---- sliding_counter ------------------------------------------------
	// b0 = t0 + 1s starts a window of every length used below (t0 is 9 s
	// into a 10 s window and 59 s into a minute), and a bucket: a window W
	// is split in 20 buckets of W/20, each keeping its units c and its
	// first and last arrival f <= l. At t the window (t-W, t] starts at s =
	// t-W in bucket m0: est = the units of the buckets after m0 + max(p, c -
	// B) for m0's, B = ceil(limit/20), p = c while f > s, 0 once l <= s,
	// else 1 + (c-2)(l-s)/(l-f).
	{
		// DESIGN.md's window-boundary case on the counter: 100 at t0 (59 s
		// into the minute, in the bucket [57 s, 60 s)). They count whole
		// while they are in the window (until t0 + 60 s), then, gone, still
		// 100 - B = 95 until their bucket has left (t0 + 61 s): 5 get in at
		// t0 + 60 s, no 2x across the boundary.
		name: "sliding_counter/window boundary: at most limit + one bucket across a boundary", alg: limiter.SlidingCounter, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: time.Minute, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: time.Minute},
			{at: time.Second, allowed: false, count: 100, retry: 59 * time.Second},
			{at: time.Minute - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: time.Minute, n: 5, allowed: true, count: 100},
			{at: time.Minute, allowed: false, count: 100, retry: time.Second},
			{at: 61 * time.Second, allowed: true, count: 6},
		},
	},
	{
		name: "sliding_counter/oldest bucket by its first and last arrival", alg: limiter.SlidingCounter, limit: 10, window: 10 * time.Second,
		steps: []step{
			// 6 at b0 count whole until they leave the window (b0 + 10 s),
			// then 6 - B = 5 while their bucket is the oldest.
			{at: b0, cost: 6, allowed: true, count: 6, reset: 10 * time.Second, chkReset: true},
			{at: b0 + 5*time.Second, cost: 4, allowed: true, count: 10},
			// Full; 4 + max(0, 5) <= 9 at b0 + 10 s.
			{at: b0 + 9*time.Second, allowed: false, count: 10, retry: time.Second},
			{at: b0 + 11*time.Second, allowed: true, count: 5},                     // b0's bucket gone: 4 + 1
			{at: b0 + 12500*time.Millisecond, peek: true, allowed: true, count: 5}, // the window starts in an empty bucket
			{at: b0 + 12500*time.Millisecond, cost: 5, allowed: true, count: 10},
			// 6 + max(0, 3) <= 9 once the 4 of b0 + 5 s have left (b0 + 15 s).
			{at: b0 + 12500*time.Millisecond, allowed: false, count: 10, retry: 2500 * time.Millisecond},
		},
	},
	{
		name: "sliding_counter/peek, cost and rejections", alg: limiter.SlidingCounter, limit: 4, window: 10 * time.Second,
		steps: []step{
			{at: b0, peek: true, n: 3, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: b0, cost: 3, allowed: true, count: 3, reset: 10 * time.Second, chkReset: true},
			// Cost 2 needs est <= 2: max(0, 3 - B) = 2 once the 3 have left
			// the window (b0 + 10 s).
			{at: b0 + 5*time.Second, cost: 2, allowed: false, count: 3, retry: 5 * time.Second},
			{at: b0 + 5*time.Second, cost: 2, n: 10, allowed: false, count: 3, retry: 5 * time.Second},
			{at: b0 + 5*time.Second, allowed: true, count: 4},
			{at: b0 + 5*time.Second, peek: true, allowed: false, count: 4, retry: 5 * time.Second},
			{at: b0 + 12500*time.Millisecond, allowed: true, count: 2}, // 1 + 1
		},
	},
	{
		// The hash carries its newest bucket: a key two windows old reads
		// as empty on its own, whether or not Redis has expired it yet (on
		// the injected clock it has not).
		name: "sliding_counter/stale state reads as empty", alg: limiter.SlidingCounter, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, n: 5, allowed: true, count: 5},
			{at: b0 + 10*time.Second - time.Microsecond, allowed: false, count: 5, retry: time.Microsecond},
			{at: b0 + 20*time.Second, allowed: true, count: 1},
		},
	},
	{
		name: "sliding_counter/global ceiling", alg: limiter.SlidingCounter, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			// max(0, 5 - B) <= 4 once the 5 have left the window.
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 10 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			// The global 2 + max(0, 4) <= 6 at the same time.
			{at: b0 + 2*time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 20*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 20*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 20*time.Second, region: "gb", allowed: true, count: 2, global: 7},
		},
	},

	// ---- fixed_window ---------------------------------------------------
	{
		// DESIGN.md's window-boundary case on a fixed window: the minute
		// turns over at t0+1s and the counter starts from zero, so 200
		// requests pass within one second. This is the leak the sliding
		// algorithms exist to prevent.
		name: "fixed_window/window boundary: lets 2x the limit through across a boundary (by design)", alg: limiter.FixedWindow, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: time.Second, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: time.Second},
			{at: time.Second - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: time.Second, n: 100, allowed: true, count: 100}, // 200 admitted in 1 s
			{at: time.Second, allowed: false, count: 100, retry: time.Minute},
			{at: 61*time.Second - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: 61 * time.Second, allowed: true, count: 1, reset: time.Minute, chkReset: true},
		},
	},
	{
		name: "fixed_window/peek, cost and rejections", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, peek: true, n: 3, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: b0, cost: 3, allowed: true, count: 3, reset: 10 * time.Second, chkReset: true},
			{at: b0 + time.Second, cost: 3, allowed: false, count: 3, retry: 9 * time.Second},
			{at: b0 + 2*time.Second, cost: 3, n: 20, allowed: false, count: 3, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, cost: 2, allowed: true, count: 5, reset: 8 * time.Second, chkReset: true},
			{at: b0 + 10*time.Second - time.Microsecond, peek: true, allowed: false, count: 5, retry: time.Microsecond},
			{at: b0 + 10*time.Second, cost: 5, allowed: true, count: 5},
		},
	},
	{
		name: "fixed_window/stale state reads as empty", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, n: 5, allowed: true, count: 5},
			{at: b0 + 10*time.Second, allowed: true, count: 1},
			{at: b0 + 30*time.Second, allowed: true, count: 1},
		},
	},
	{
		name: "fixed_window/global ceiling", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 10 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			{at: b0 + 2*time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 10*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 11*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 11*time.Second, region: "gb", allowed: true, count: 2, global: 7},
		},
	},
	{
		name: "fixed_window/several windows", alg: limiter.FixedWindow,
		windows: []limiter.Window{{Duration: time.Second}, {Duration: 10 * time.Second}}, limits: []int64{2, 3},
		steps: []step{
			{at: b0, n: 2, allowed: true, counts: []int64{2, 2}, count: -1},
			{at: b0, allowed: false, counts: []int64{2, 2}, count: -1, retry: time.Second},
			{at: b0 + time.Second, allowed: true, counts: []int64{1, 3}, count: -1},
			{at: b0 + 1500*time.Millisecond, allowed: false, counts: []int64{1, 3}, count: -1, retry: 8500 * time.Millisecond},
			{at: b0 + 10*time.Second, allowed: true, counts: []int64{1, 1}, count: -1},
		},
	},

	// ---- token_bucket (GCRA) ----------------------------------------------
	// Emission interval T = window/limit; the bucket holds burst units
	// (burst 0: limit); count = units in use; reset = time until full.
	{
		// 100 per minute: T = 600 ms. A full bucket takes 100 at once, then
		// one unit comes back every 600 ms.
		name: "token_bucket/full burst, then one unit per interval", alg: limiter.TokenBucket, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: time.Minute, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: 600 * time.Millisecond},
			{at: 600*time.Millisecond - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: 600 * time.Millisecond, allowed: true, count: 100},
			{at: time.Second, allowed: false, count: 100, retry: 200 * time.Millisecond},
			{at: 30*time.Second + 600*time.Millisecond, peek: true, allowed: true, count: 50, reset: 30 * time.Second, chkReset: true},
			{at: 60*time.Second + 600*time.Millisecond, peek: true, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: 60*time.Second + 600*time.Millisecond, n: 100, allowed: true, count: 100},
		},
	},
	{
		name: "token_bucket/burst below the limit", alg: limiter.TokenBucket, limit: 10, burst: 3, window: 10 * time.Second,
		steps: []step{
			{at: 0, n: 3, allowed: true, count: 3, reset: 3 * time.Second, chkReset: true},
			{at: 0, allowed: false, count: 3, retry: time.Second},
			{at: time.Second, allowed: true, count: 3},
			{at: 5 * time.Second, cost: 3, allowed: true, count: 3},
			{at: 8 * time.Second, cost: 3, allowed: true, count: 3},
		},
	},
	{
		// Limit 10 per 10 s, burst 20: a cost of 15 is above the limit but
		// within the capacity, so it fits a full bucket.
		name: "token_bucket/burst above the limit", alg: limiter.TokenBucket, limit: 10, burst: 20, window: 10 * time.Second,
		steps: []step{
			{at: 0, cost: 15, allowed: true, count: 15, reset: 15 * time.Second, chkReset: true},
			{at: 0, cost: 6, allowed: false, count: 15, retry: time.Second},
			{at: 0, cost: 5, allowed: true, count: 20},
		},
	},
	{
		// 3 per 2 s: T = 666666.67 µs, kept as 666667 µs. Rounding T once
		// keeps the state exact, so the third unit of the burst still fits at
		// once and one admission counts as exactly one unit.
		name: "token_bucket/interval not a whole µs: a full burst still fits at once", alg: limiter.TokenBucket, limit: 3, window: 2 * time.Second,
		steps: []step{
			{at: 0, allowed: true, count: 1, reset: 666667 * time.Microsecond, chkReset: true},
			{at: 0, n: 2, allowed: true, count: 3},
			{at: 0, allowed: false, count: 3, retry: 666667 * time.Microsecond},
			{at: 666667 * time.Microsecond, allowed: true, count: 3},
		},
	},
	{
		name: "token_bucket/peek and rejections record nothing", alg: limiter.TokenBucket, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, peek: true, n: 5, allowed: true, count: 0},
			{at: 0, allowed: true, count: 1},
			{at: 0, peek: true, allowed: true, count: 1},
			{at: 0, allowed: true, count: 2},
			{at: time.Second, peek: true, allowed: false, count: 2, retry: 4 * time.Second},
			{at: time.Second, n: 50, allowed: false, count: 2, retry: 4 * time.Second},
			{at: 5 * time.Second, allowed: true, count: 2},
		},
	},
	{
		// Region: T = 2 s. Global: T = 10 s / 7 = 1428571 µs.
		name: "token_bucket/global ceiling", alg: limiter.TokenBucket, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 2 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			// The global's TAT is b0 + 1 s + 8999997 µs; one more unit needs
			// 8999997 + 1428571 - 7 * 1428571 = 428571 µs more.
			{at: b0 + time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 428571 * time.Microsecond},
			{at: b0 + time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: time.Second},
			{at: b0 + 11*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 11*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 11*time.Second, region: "us", allowed: false, count: 5, global: 6, retry: 2 * time.Second},
		},
	},
	{
		// 2 per second (T = 500 ms) and 3 per 10 s (T = 3333333 µs).
		name: "token_bucket/several windows", alg: limiter.TokenBucket,
		windows: []limiter.Window{{Duration: time.Second}, {Duration: 10 * time.Second}}, limits: []int64{2, 3},
		steps: []step{
			{at: 0, n: 2, allowed: true, counts: []int64{2, 2}, count: -1},
			{at: 0, allowed: false, counts: []int64{2, 2}, count: -1, retry: 500 * time.Millisecond},
			{at: 500 * time.Millisecond, allowed: true, counts: []int64{2, 3}, count: -1},
			// The 10 s bucket is empty: 9499999 + 3333333 - 9999999 µs.
			{at: 500 * time.Millisecond, allowed: false, counts: []int64{2, 3}, count: -1, retry: 2833333 * time.Microsecond},
		},
	},
}

// backend opens a store stack for one test.
type backend struct {
	name string
	open func(t *testing.T) limiter.Backend
}

// backends lists every store stack the conformance table runs against, on
// Redis 7 both ways of calling the script (the function library and
// EVALSHA), and on Redis 6 both ways of calling it by EVALSHA (the cached
// body, lua.DecideCached, and the scripts that define all on each call).
// The real redis-servers are started once for the calling test (t), and
// every case uses its own random identity on them.
func backends(t *testing.T) []backend {
	srv := redistest.Start(t)
	client := srv.Client(t)
	client6 := redistest.StartRedis6(t).Client(t)
	return []backend{
		{"memory", func(t *testing.T) limiter.Backend {
			s := limiter.NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			return limiter.Backend{Store: s, Source: limiter.SourceMemory}
		}},
		{"miniredis", func(t *testing.T) limiter.Backend {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return limiter.Backend{Store: limiter.NewRedisStore(c), Source: limiter.SourceRedis}
		}},
		{"redis-server", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client), Source: limiter.SourceRedis}
		}},
		{"redis-server, counter format 3", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.CounterFormat3)), Source: limiter.SourceRedis}
		}},
		{"miniredis, counter format 3", func(t *testing.T) limiter.Backend {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return limiter.Backend{Store: limiter.NewRedisStore(c, limiter.WithStateFormat(limiter.CounterFormat3)), Source: limiter.SourceRedis}
		}},
		{"redis-server EVALSHA", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client, limiter.WithScripts(limiter.ScriptsEval)), Source: limiter.SourceRedis}
		}},
		{"production stack: deny cache, breaker, batched redis-server", func(t *testing.T) limiter.Backend {
			return productionStack(t, client)
		}},
		{"production stack, EVALSHA", func(t *testing.T) limiter.Backend {
			return productionStack(t, client, limiter.WithScripts(limiter.ScriptsEval))
		}},
		{"redis-server, the cached script where rawset is refused (Redis 7)", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client, limiter.WithCachedScript()), Source: limiter.SourceRedis}
		}},
		{"Redis 6 (the cached script)", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client6), Source: limiter.SourceRedis}
		}},
		{"Redis 6 EVALSHA", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client6, limiter.WithScripts(limiter.ScriptsEval)), Source: limiter.SourceRedis}
		}},
		{"production stack, Redis 6", func(t *testing.T) limiter.Backend {
			return productionStack(t, client6)
		}},
	}
}

// productionStack is what a Caddy limiter on Redis runs: a deny cache in
// front of a breaker in front of the batched Redis store, with notices.
// On Redis 7 it calls the function library unless opts say otherwise.
func productionStack(t *testing.T, client limiter.Scripter, opts ...limiter.RedisOption) limiter.Backend {
	s := limiter.NewRedisStore(client, append([]limiter.RedisOption{limiter.WithBatching(2, 16)}, opts...)...)
	t.Cleanup(func() { s.Close() })
	br := limiter.NewBreaker(s, limiter.BreakerConfig{IsFailure: limiter.IsUnavailable})
	return limiter.Backend{Store: br, Base: s, Source: limiter.SourceRedis, Remote: true, Notifier: s}
}

func randomID(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "id-" + hex.EncodeToString(b[:])
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := be.open(t)
			for _, cc := range conformance {
				t.Run(cc.name, func(t *testing.T) {
					t.Parallel()
					runCase(t, b, cc)
				})
			}
		})
	}
}

// testClock is an injected clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// caseLimiter builds the limiter of a conformance case, on clock, under
// prefix.
func caseLimiter(t *testing.T, b limiter.Backend, cc confCase, clock *testClock, prefix string) (*limiter.Limiter, limiter.Input) {
	p := limiter.Policy{
		Name: "conf", KeyPrefix: prefix, Algorithm: cc.alg, Burst: cc.burst, Regions: cc.region,
		Ban: cc.ban, AppClock: true, Now: clock.Now, Timeout: 5 * time.Second,
	}
	in := limiter.Input{Identity: randomID(t)}
	if cc.windows != nil {
		p.Windows, in.Limits = cc.windows, cc.limits
	} else {
		p.Windows, in.Limits = []limiter.Window{{Duration: cc.window}}, []int64{cc.limit}
	}
	if cc.globalLimit > 0 {
		p.GlobalWindows, in.GlobalLimits = []limiter.Window{{Duration: cc.window}}, []int64{cc.globalLimit}
	}
	l, err := limiter.New(p, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, in
}

func runCase(t *testing.T, b limiter.Backend, cc confCase) {
	clock := &testClock{t: t0}
	l, in := caseLimiter(t, b, cc, clock, "test:")
	ctx := context.Background()
	for i, st := range cc.steps {
		clock.Set(t0.Add(st.at))
		in.Region, in.Cost = st.region, st.cost
		n := max(st.n, 1)
		var d limiter.Decision
		var err error
		for j := 0; j < n; j++ {
			if st.peek {
				d, err = l.Peek(ctx, &in)
			} else {
				d, err = l.Decide(ctx, &in)
			}
			if err != nil {
				t.Fatalf("step %d (%d/%d): %v", i, j+1, n, err)
			}
			if d.Err != nil {
				t.Fatalf("step %d (%d/%d): store error %v", i, j+1, n, d.Err)
			}
			if j < n-1 && d.Pass != st.allowed {
				t.Fatalf("step %d (%d/%d): allowed=%v, want %v", i, j+1, n, d.Pass, st.allowed)
			}
		}
		checkStep(t, fmt.Sprintf("step %d (at +%s, region %q)", i, st.at, st.region), cc, st, &d)
	}
}

// checkStep holds a decision to a step. A cached denial knows only the
// windows that denied and their retry time: counts are checked when known.
func checkStep(t *testing.T, where string, cc confCase, st step, d *limiter.Decision) {
	t.Helper()
	if d.Pass != st.allowed {
		t.Fatalf("%s: allowed=%v, want %v (%+v)", where, d.Pass, st.allowed, d)
	}
	if d.Banned != st.banned {
		t.Fatalf("%s: banned=%v, want %v (%+v)", where, d.Banned, st.banned, d)
	}
	if d.RetryAfter != st.retry {
		t.Errorf("%s: retry after %s, want %s (%s)", where, d.RetryAfter, st.retry, d.Source)
	}
	w := d.Windows
	nb := len(cc.limits)
	if nb == 0 {
		nb = 1
	}
	for i := 0; i < nb; i++ {
		capacity := cc.limit
		if cc.limits != nil {
			capacity = cc.limits[i]
		}
		if cc.alg == limiter.TokenBucket && cc.burst > 0 {
			capacity = cc.burst
		}
		if w[i].Limit != capacity {
			t.Errorf("%s: window %d limit=%d, want %d", where, i, w[i].Limit, capacity)
		}
		if !w[i].Known {
			if d.Source != limiter.SourceDenyCache || d.Pass {
				t.Errorf("%s: window %d unknown from %s", where, i, d.Source)
			}
			continue
		}
		want := int64(-1)
		if st.counts != nil {
			want = st.counts[i]
		} else if i == 0 {
			want = st.count
		}
		if want >= 0 && w[i].Count != want {
			t.Errorf("%s: window %d count=%d, want %d", where, i, w[i].Count, want)
		}
		wantRem := max(capacity-w[i].Count, 0)
		if w[i].Denied {
			wantRem = 0
		}
		if w[i].Remaining != wantRem {
			t.Errorf("%s: window %d remaining=%d, want %d", where, i, w[i].Remaining, wantRem)
		}
	}
	if st.chkReset && w[0].Known && w[0].Reset != st.reset {
		t.Errorf("%s: reset after %s, want %s", where, w[0].Reset, st.reset)
	}
	if cc.globalLimit > 0 {
		g := w[nb]
		if g.Known && st.global >= 0 && g.Count != st.global {
			t.Errorf("%s: global count=%d, want %d", where, g.Count, st.global)
		}
		if (g.Known || g.Denied) && g.Denied != st.globalDen {
			t.Errorf("%s: global denied=%v, want %v", where, g.Denied, st.globalDen)
		}
	}
}
