package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Window is one limit of a policy: a duration (sliding, or fixed for
// fixed_window) or a calendar period.
type Window struct {
	// Duration is the window's length; 0 for a calendar period.
	Duration time.Duration
	// Period is the calendar period; PeriodNone for a duration window.
	Period Period
}

// Label names the window in headers, placeholders and metrics: "1s",
// "500ms", "1h", "7d", or the period ("day", "month").
func (w Window) Label() string {
	if w.Period != PeriodNone {
		return w.Period.String()
	}
	return DurationLabel(w.Duration)
}

// DurationLabel is a compact duration: the largest whole unit of d among
// days, hours, minutes, seconds and milliseconds ("1d", "90s", "250ms").
func DurationLabel(d time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}}
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}

// Ban is a penalty box: a key denied After times within Within is banned
// (every request denied) for For.
type Ban struct {
	After  int64
	Within time.Duration
	For    time.Duration
}

// Queue makes a denied request wait for its turn instead of being refused:
// a request whose Retry-After is at most MaxWait sleeps until then and is
// checked again, at most MaxWaiters at once per limiter (the rest are
// refused at once).
type Queue struct {
	MaxWait    time.Duration
	MaxWaiters int
}

// DefaultMaxWaiters bounds the waiting requests of a limiter when a Queue
// does not say.
const DefaultMaxWaiters = 1024

// Jitter adds a random delay to the Retry-After of denials, so clients told
// to come back at the same second do not all return together: up to Max, or
// up to Share of the retry time.
type Jitter struct {
	Max   time.Duration
	Share float64
}

// FailMode is what happens when the store cannot decide.
type FailMode uint8

// The fail modes.
const (
	// FailOpen passes the request.
	FailOpen FailMode = iota
	// FailClosed refuses it (503).
	FailClosed
	// FailLocal decides it with the in-process store, per process.
	FailLocal
)

var failNames = [...]string{FailOpen: "open", FailClosed: "closed", FailLocal: "local"}

func (f FailMode) String() string { return failNames[f] }

// ParseFailMode maps "open", "closed" or "local" to a FailMode.
func ParseFailMode(s string) (FailMode, error) {
	for i, n := range failNames {
		if n == s {
			return FailMode(i), nil
		}
	}
	return 0, fmt.Errorf("fail must be open, closed or local, got '%s'", s)
}

// Policy is what a Limiter enforces. Limits that vary per request (a tier,
// a cost) come with each Input; everything else is here.
type Policy struct {
	// Name names the limiter: in its keys, its RateLimit policy items and
	// its metrics.
	Name string
	// KeyPrefix starts every key (default DefaultKeyPrefix).
	KeyPrefix string
	// Algorithm counts the duration windows.
	Algorithm Algorithm
	// Windows are the bucket's windows (identity, × region with Regions);
	// a request must fit every one. Input.Limits gives their limits.
	Windows []Window
	// GlobalWindows are the identity's ceiling across its regions (needs
	// Regions); Input.GlobalLimits gives their limits.
	GlobalWindows []Window
	// Burst is, for token_bucket with one duration window, the bucket's
	// capacity (0: the limit).
	Burst int64
	// Regions gives each (identity, region) its own bucket.
	Regions bool
	// Location is the time zone of calendar periods (default UTC).
	Location *time.Location
	// Ban, when set, is the penalty box of each bucket.
	Ban *Ban
	// Concurrency bounds the requests of a bucket in flight at once
	// (Input.MaxConcurrent); a lease not released (a node that died)
	// expires after LeaseTimeout.
	Concurrency  bool
	LeaseTimeout time.Duration
	// CountOnly, when set, records a request's units only after its
	// response, when CountOnly(status) is true (Done); the check before it
	// runs denies a key already at its limit.
	CountOnly func(status int) bool
	// Queue, when MaxWait > 0, lets denied requests wait for their turn.
	Queue Queue
	// Jitter randomises the Retry-After of denials.
	Jitter Jitter
	// Fail is what happens when the store cannot decide.
	Fail FailMode
	// DryRun passes every request; Decision.DryRun marks would-be denials.
	// It records what it admits, as an enforcing limiter would; its
	// would-be refusals count toward a ban of its own (key segment
	// "dryban"), which no enforcing limiter reads.
	DryRun bool
	// AppClock sends this process's clock (Now) to the store; otherwise
	// the Redis store reads Redis TIME (one clock for every node).
	AppClock bool
	// Now is this process's clock (default time.Now).
	Now func() time.Time
	// Timeout bounds one store call; then the fail mode applies.
	Timeout time.Duration
}

// DefaultLeaseTimeout is how long a lease lives when LeaseTimeout is 0.
const DefaultLeaseTimeout = time.Minute

// PolicyError is a policy that cannot be enforced. Field names the
// configuration item at fault (window, global_limit, burst, ...), so a
// configuration loader can point at it; Window, when not 0, is the 1-based
// index of the window at fault in Windows (or in GlobalWindows, when Global).
type PolicyError struct {
	Field  string
	Window int
	Global bool
	Err    error
}

func (e *PolicyError) Error() string { return e.Err.Error() }
func (e *PolicyError) Unwrap() error { return e.Err }

func policyErr(field, format string, args ...any) error {
	return &PolicyError{Field: field, Err: fmt.Errorf(format, args...)}
}

// ErrPolicy is wrapped by every PolicyError.
var ErrPolicy = errors.New("invalid policy")

// Check reports what makes the policy impossible to enforce, as a
// *PolicyError.
func (p *Policy) Check() error {
	if err := ValidName(p.Name); err != nil {
		return policyErr("name", "%v", err)
	}
	if int(p.Algorithm) >= len(algorithmNames) {
		return policyErr("algorithm", "%v", ErrUnknownAlgorithm)
	}
	if len(p.Windows) == 0 {
		return policyErr("limit", "a limit is required")
	}
	if len(p.GlobalWindows) > 0 && !p.Regions {
		return policyErr("global_limit", "global_limit needs region (it is the ceiling across regions)")
	}
	for _, ws := range []struct {
		field string
		w     []Window
	}{{"limit", p.Windows}, {"global_limit", p.GlobalWindows}} {
		if len(ws.w) > MaxWindows {
			return &PolicyError{Field: ws.field, Window: MaxWindows + 1, Global: ws.field == "global_limit",
				Err: fmt.Errorf("at most %d windows per %s, got %d", MaxWindows, ws.field, len(ws.w))}
		}
		seen := map[string]bool{}
		for i, w := range ws.w {
			at := func(field, format string, args ...any) error {
				return &PolicyError{Field: field, Window: i + 1, Global: ws.field == "global_limit", Err: fmt.Errorf(format, args...)}
			}
			if w.Period == PeriodNone {
				if w.Duration < time.Millisecond {
					return at("window", "window must be at least 1ms, got %s", w.Duration)
				}
				if w.Duration.Microseconds() > maxWindowMicros {
					return at("window", "window must be at most 10 years (use a calendar period or a higher limit), got %s", w.Duration)
				}
				if w.Duration%time.Microsecond != 0 {
					return at("window", "window must be a whole number of microseconds, got %s", w.Duration)
				}
			} else if w.Period > PeriodMonth {
				return at(ws.field, "unknown calendar period %d", w.Period)
			}
			if l := w.Label(); seen[l] {
				return at(ws.field, "two %s lines with the window %s: give each window once", ws.field, l)
			} else {
				seen[l] = true
			}
		}
	}
	durations := 0
	for _, w := range p.Windows {
		if w.Period == PeriodNone {
			durations++
		}
	}
	if p.Burst < 0 || p.Burst > MaxValue {
		return policyErr("burst", "burst must be a positive integer up to 2^50, got %d", p.Burst)
	}
	if p.Burst > 0 {
		if p.Algorithm != TokenBucket {
			return policyErr("burst", "burst is the capacity of algorithm token_bucket; %s has none", p.Algorithm)
		}
		if durations != 1 {
			return policyErr("burst", "burst needs exactly one duration window (each of several windows is a bucket of its own limit)")
		}
	}
	if p.Burst > 0 && durations == 1 {
		for _, w := range p.Windows {
			// The script computes burst * interval (at most burst * window
			// µs, with a limit of 1) in doubles.
			if w.Period == PeriodNone && float64(p.Burst)*float64(w.Duration.Microseconds()) > 1<<53 {
				return policyErr("burst", "burst %d over a window of %s is beyond what the script computes exactly (burst × window in µs must stay below 2^53)", p.Burst, w.Duration)
			}
		}
	}
	if b := p.Ban; b != nil {
		if b.After <= 0 || b.After > MaxValue {
			return policyErr("ban", "ban needs a positive number of denials, got %d", b.After)
		}
		if b.Within < time.Millisecond || b.For < time.Millisecond ||
			b.Within.Microseconds() > maxWindowMicros || b.For.Microseconds() > maxWindowMicros {
			return policyErr("ban", "ban durations must be 1ms to 10 years, got %s and %s", b.For, b.Within)
		}
	}
	if p.LeaseTimeout < 0 || p.LeaseTimeout.Microseconds() > maxWindowMicros {
		return policyErr("lease_timeout", "lease_timeout must be positive, got %s", p.LeaseTimeout)
	}
	if p.Concurrency && p.LeaseTimeout > 0 && p.LeaseTimeout < time.Millisecond {
		return policyErr("lease_timeout", "lease_timeout must be at least 1ms, got %s", p.LeaseTimeout)
	}
	if p.Queue.MaxWait < 0 || p.Queue.MaxWaiters < 0 {
		return policyErr("queue", "queue needs a positive wait and a positive number of waiters")
	}
	if p.Jitter.Max < 0 || p.Jitter.Share < 0 || p.Jitter.Share > 10 {
		return policyErr("jitter", "jitter must be a positive duration or a share up to 1000%%")
	}
	if p.Timeout < 0 {
		return policyErr("timeout", "timeout must not be negative")
	}
	return nil
}

// Capacity is what one request in window w (of limit) may at most cost:
// the limit, or for a token bucket's duration window its burst (the
// bucket's: a global ceiling's token bucket holds its limit).
func (p *Policy) Capacity(w Window, limit int64, global bool) int64 {
	if p.Algorithm == TokenBucket && w.Period == PeriodNone && p.Burst > 0 && !global {
		return p.Burst
	}
	return limit
}
