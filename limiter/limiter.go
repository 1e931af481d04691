// Package limiter is the engine of sliding_ratelimit. It knows nothing of
// Caddy and can serve any Go HTTP stack.
//
// Two levels:
//
//   - A Limiter is built once from a Policy (algorithm, windows and limits,
//     global ceiling, ban, concurrency, count_only, queue, jitter, fail mode,
//     dry run, clock) and a Backend (the store stack). Limiter.Decide takes
//     one request's resolved Input and returns one Decision: allowed or
//     not, why, who decided, every window's usage, the Retry-After. Every
//     status, header, body, placeholder and metric is rendered from it.
//   - A Store decides one Op (the request's keys and windows) atomically:
//     the Redis store (one script call, EVALSHA, batched), the in-process
//     store (the same answers), and the stores in front of them: a DenyCache
//     (over-limit keys answered without a store call) and a Breaker (a
//     circuit that stops paying the timeout during an outage).
//
// The request flows down: Limiter → DenyCache → Breaker → RedisStore, and
// on a store error to the fail mode (open, closed, or the in-process store).
//
// A global ceiling kept in a ledger every data centre shares (global_redis)
// is package limiter/dc, which imports nothing of this one: the engine
// calls it through one interface (ceiling.go) and keeps the decision.
package limiter

import (
	"errors"
	"fmt"
)

// Algorithm selects how the duration windows of a limiter count requests.
type Algorithm uint8

// The algorithms.
const (
	// SlidingLog keeps one entry per admitted request: exact.
	SlidingLog Algorithm = iota
	// SlidingCounter keeps the counts of the current and the previous fixed
	// window and weighs the previous one by its overlap with the sliding
	// window: approximate, O(1) per key.
	SlidingCounter
	// FixedWindow counts units per fixed window (floor(now/window)): O(1),
	// but lets up to twice the limit through across a window boundary.
	FixedWindow
	// TokenBucket is GCRA: a steady rate of limit per window with bursts of
	// up to the burst, O(1) per key.
	TokenBucket
)

var algorithmNames = [...]string{
	SlidingLog:     "sliding_log",
	SlidingCounter: "sliding_counter",
	FixedWindow:    "fixed_window",
	TokenBucket:    "token_bucket",
}

// algorithmKinds maps an algorithm to the kind of its keys.
var algorithmKinds = [...]Kind{
	SlidingLog:     KindLog,
	SlidingCounter: KindCounter,
	FixedWindow:    KindFixed,
	TokenBucket:    KindToken,
}

// String returns the algorithm's configuration name.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// kind is the kind of the algorithm's keys.
func (a Algorithm) kind() Kind { return algorithmKinds[a] }

// Algorithms lists the configuration names, in order.
func Algorithms() []string { return algorithmNames[:] }

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
