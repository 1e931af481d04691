// Package limiter is the engine of sliding_ratelimit: the request and result
// types, the Store interface, the Redis store and the in-process store, and
// key building. It knows nothing of Caddy and can serve any Go HTTP stack.
//
// Error policy: a Store returns an error only when it could not decide (Redis
// unreachable, timed out, a malformed reply). "Over the limit" is a Result
// with Allowed false, never an error.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Algorithm selects how a bucket counts requests.
type Algorithm uint8

// The algorithms. Their numeric values index the script table of the Redis
// store; the names are the configuration names.
const (
	// SlidingLog keeps one entry per admitted unit in a window: exact.
	SlidingLog Algorithm = iota
	// SlidingCounter keeps the counts of the current and the previous fixed
	// window and weighs the previous one by its overlap with the sliding
	// window: approximate, O(1) per key.
	SlidingCounter
	// FixedWindow counts units per fixed window (floor(now/window)): O(1),
	// but lets up to twice the limit through across a window boundary.
	FixedWindow
	// TokenBucket is GCRA: a steady rate of limit per window with bursts of
	// up to Bucket.Burst units, O(1) per key.
	TokenBucket
)

var algorithmNames = [...]string{
	SlidingLog:     "sliding_log",
	SlidingCounter: "sliding_counter",
	FixedWindow:    "fixed_window",
	TokenBucket:    "token_bucket",
}

// String returns the algorithm's configuration name.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ErrUnknownAlgorithm is returned by ParseAlgorithm for a name it does not know.
var ErrUnknownAlgorithm = errors.New("unknown algorithm")

// ParseAlgorithm maps a configuration name to an Algorithm.
func ParseAlgorithm(name string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w '%s' (want sliding_log, sliding_counter, fixed_window or token_bucket)", ErrUnknownAlgorithm, name)
}

// Bucket is one budget a request is counted against.
type Bucket struct {
	// Key is the store key, as built by KeyBuilder.
	Key string
	// Limit is the number of units the bucket admits per window (> 0).
	Limit int64
	// Burst is, for TokenBucket, the most units the bucket admits at once
	// (its capacity); 0 means Limit. Other algorithms ignore it.
	Burst int64
}

// Request asks a Store whether a request fits its bucket(s).
type Request struct {
	// Algorithm selects the counting scheme.
	Algorithm Algorithm
	// Window is the length of the sliding window (>= 1ms).
	Window time.Duration
	// Cost is the number of units the request consumes (>= 1). Zero means 1.
	Cost int64
	// Now is the time of the request. The zero value asks the store to use
	// its own clock: Redis TIME for the Redis store, so every Caddy node
	// shares one clock.
	Now time.Time
	// Bucket is the request's budget, e.g. identity × region.
	Bucket Bucket
	// Global is an optional second budget (the identity's ceiling across
	// regions), checked and recorded in the same atomic step as Bucket.
	// An empty Key means none.
	Global Bucket
}

// HasGlobal reports whether the request carries a global ceiling.
func (r *Request) HasGlobal() bool { return r.Global.Key != "" }

// capacity is what Usage.Limit reports for b: its limit, or for a token
// bucket its burst capacity, so Remaining is the tokens left.
func (r *Request) capacity(b *Bucket) int64 {
	if r.Algorithm == TokenBucket && b.Burst > 0 {
		return b.Burst
	}
	return b.Limit
}

func (r *Request) cost() int64 {
	if r.Cost <= 0 {
		return 1
	}
	return r.Cost
}

// Usage describes one bucket after a decision.
type Usage struct {
	// Limit is the bucket's limit; for a token bucket with a burst, its
	// capacity (the burst).
	Limit int64
	// Count is the number of units in the window after the request (for a
	// peek, before it). For sliding_counter it is the weighted estimate
	// rounded up; for token_bucket the units in use, burst minus the whole
	// tokens left.
	Count int64
	// Remaining is Limit - Count, never below zero.
	Remaining int64
	// Denied is true when this bucket had no room for the request.
	Denied bool
	// RetryAfter is, when Denied, the exact time until the bucket has room
	// for the request's cost.
	RetryAfter time.Duration
	// ResetAfter is the time until more quota comes back; zero for an empty
	// bucket. Per algorithm:
	//   - sliding_log: until the oldest unit in the window leaves it;
	//   - sliding_counter: until the estimate has dropped by one unit;
	//   - fixed_window: until the current window ends;
	//   - token_bucket: until the bucket is full again.
	ResetAfter time.Duration
}

// Result is a Store's decision.
type Result struct {
	// Allowed is true when the request fits every bucket; it was then
	// recorded in every bucket (unless the call was a Peek).
	Allowed bool
	// RetryAfter is zero when allowed; otherwise the later RetryAfter of the
	// buckets that denied the request.
	RetryAfter time.Duration
	// Bucket is the usage of the request's bucket.
	Bucket Usage
	// Global is the usage of the global ceiling, when the request has one.
	Global Usage
	// Cached is true for a denial served by a DenyCache without asking the
	// store behind it.
	Cached bool
}

// Store decides requests. Implementations are safe for concurrent use.
type Store interface {
	// Allow checks the request against its bucket(s) and, when it fits
	// all of them, records it in all of them, atomically.
	Allow(ctx context.Context, req *Request) (Result, error)
	// Peek reports what Allow would decide, without recording anything.
	Peek(ctx context.Context, req *Request) (Result, error)
	// Reset forgets the given keys.
	Reset(ctx context.Context, keys ...string) error
}

// validate checks what every store relies on.
// ErrInvalidRequest is wrapped by every error about a malformed Request.
var ErrInvalidRequest = errors.New("invalid rate limit request")

func (r *Request) validate() error {
	if r.Window < time.Millisecond {
		return fmt.Errorf("%w: window %s is below 1ms", ErrInvalidRequest, r.Window)
	}
	if r.Bucket.Key == "" || r.Bucket.Limit <= 0 {
		return fmt.Errorf("%w: bucket needs a key and a positive limit (got %q, %d)", ErrInvalidRequest, r.Bucket.Key, r.Bucket.Limit)
	}
	if r.HasGlobal() && r.Global.Limit <= 0 {
		return fmt.Errorf("%w: global ceiling needs a positive limit (got %d)", ErrInvalidRequest, r.Global.Limit)
	}
	if r.Bucket.Burst < 0 || r.HasGlobal() && r.Global.Burst < 0 {
		return fmt.Errorf("%w: burst must not be negative (got %d, %d)", ErrInvalidRequest, r.Bucket.Burst, r.Global.Burst)
	}
	if int(r.Algorithm) >= len(algorithmNames) {
		return fmt.Errorf("%w: %w %s", ErrInvalidRequest, ErrUnknownAlgorithm, r.Algorithm)
	}
	return nil
}

// micros converts a duration or time to the integer microseconds the scripts use.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

func unixMicros(t time.Time) int64 { return t.UnixMicro() }

// usage builds a Usage from the raw numbers both stores produce.
func usage(limit, count, retryUS, resetUS int64, denied bool) Usage {
	rem := limit - count
	if rem < 0 {
		rem = 0
	}
	u := Usage{Limit: limit, Count: count, Remaining: rem, Denied: denied}
	if denied {
		u.RetryAfter = time.Duration(retryUS) * time.Microsecond
	}
	if resetUS > 0 {
		u.ResetAfter = time.Duration(resetUS) * time.Microsecond
	}
	return u
}

// finish fills a Result's RetryAfter from its buckets.
func (res *Result) finish() {
	if res.Allowed {
		res.RetryAfter = 0
		return
	}
	res.RetryAfter = res.Bucket.RetryAfter
	if res.Global.Denied && res.Global.RetryAfter > res.RetryAfter {
		res.RetryAfter = res.Global.RetryAfter
	}
}
