package httplimit

import (
	"errors"
	"fmt"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/defaults"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redisconf"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Config is a limiter's policy: the same as a Caddyfile's sliding_ratelimit
// block gives (docs/reference.md has each subdirective; the field of the
// same name here means the same).
type Config struct {
	// Name names the limiter: part of every key, the policy name in the
	// RateLimit headers and the `limiter` label of the metrics. Letters,
	// digits, '_', '-' and '.'. Default "default".
	Name string

	// Algorithm counts the duration windows: "sliding_log" (exact, the
	// default), "sliding_counter", "fixed_window" or "token_bucket".
	Algorithm string

	// Limits are the windows and their limits (the Caddyfile's `limit`
	// lines): a request must fit every one, and one denied by any is
	// recorded in none. At least one.
	Limits []Limit

	// Region, when set, names the request's region: each (key, region)
	// pair then has its own budget.
	Region func(*http.Request) string

	// GlobalLimits are the ceiling per key across every region (needs
	// Region), checked in the same atomic step as the region's budget.
	GlobalLimits []Limit

	// Timezone is the IANA time zone of calendar periods. Default UTC.
	Timezone string

	// Cost is the units one request consumes. Default 1. CostFunc, when
	// set, gives it per request instead (a value below 1 answers 500).
	Cost     int64
	CostFunc func(*http.Request) int64

	// Burst is, for token_bucket with one duration window, the bucket's
	// capacity. Default: the limit.
	Burst int64

	// Ban puts a key denied After times within Within in a penalty box
	// for For.
	Ban *Ban

	// MaxConcurrent bounds the requests of a key (and region) in flight
	// at once; LeaseTimeout is how long one holds its place at most
	// (default 1m).
	MaxConcurrent int64
	LeaseTimeout  time.Duration

	// Key is whose budget a request spends: ClientIP, Header or a
	// function of your own. Default: ClientIP of TrustedProxies. The
	// engine bounds every key: a long value, or one with '{', '}', ':',
	// '*' or control bytes, is hashed.
	Key KeyFunc

	// TrustedProxies are the proxies (addresses or CIDR prefixes) whose
	// X-Forwarded-For the default Key believes.
	TrustedProxies []string

	// Fail is what happens when Redis cannot answer within its timeout:
	// "open" (the default) passes, "closed" answers 503, "local" decides
	// with an in-process store until Redis answers again.
	Fail string

	// Clock is "redis" (the default: the scripts read Redis TIME) or "app"
	// (this process's clock, Now). Now, when set, is the clock of "app"
	// and of the in-process store (tests move it).
	Clock string
	Now   func() time.Time

	// Headers chooses the rate limit headers: "both" (the default), "ietf",
	// "legacy" or "off".
	Headers string

	// WarnAt is the share of a limit at which an admitted request counts
	// in near_limit_total. Default 0.85; negative disables it.
	WarnAt float64

	// DryRun counts and reports, never blocks, and sends no headers.
	DryRun bool

	// DenyCacheSize bounds the over-limit cache in front of Redis: 0 the
	// default (65536 keys), -1 off.
	DenyCacheSize int

	// Redis is the store every process sharing it counts in; nil keeps
	// the state in this process.
	Redis *RedisConfig

	// GlobalRedis is the ledger every data centre shares, so that
	// GlobalLimits hold across data centres; Datacenter names this one.
	GlobalRedis *RedisConfig
	Datacenter  string

	// Metrics, when set, counts this limiter's decisions (NewMetrics; the
	// caller registers its collectors).
	Metrics *Metrics
}

// Limit is one window and its limit: Limit units per Window (a duration,
// at least 1ms), or per Period ("hour", "day", "week", "month" in
// Timezone).
type Limit struct {
	Limit  int64
	Window time.Duration
	Period string
}

// Ban is a penalty box: After denials within Within ban a key for For.
type Ban struct {
	After  int64
	Within time.Duration
	For    time.Duration
}

// RedisConfig is a Redis: one server (URL or one address), a Cluster
// (several addresses, or Cluster), or a Sentinel group (Sentinel and the
// Sentinels' addresses); TLS, an ACL user, timeouts, pipelines, key
// prefix. Its fields are the Caddyfile's redis subdirectives.
type RedisConfig = redisconf.Config

// RedisTLS is TLS to Redis.
type RedisTLS = redisconf.TLS

// DefaultWarnAt is WarnAt's default.
const DefaultWarnAt = defaults.WarnAt

// configErr is a configuration error naming its field.
func configErr(field, format string, args ...any) error {
	return fmt.Errorf("httplimit: %s: %s", field, fmt.Sprintf(format, args...))
}

// defaults fills in the defaults of the fields left unset.
func (c *Config) defaults() {
	if c.Name == "" {
		c.Name = defaults.Name
	}
	if c.Fail == "" {
		c.Fail = defaults.Fail
	}
	if c.Clock == "" {
		c.Clock = defaults.Clock
	}
	if c.Headers == "" {
		c.Headers = defaults.Headers
	}
	if c.WarnAt == 0 {
		c.WarnAt = defaults.WarnAt
	}
	if c.Cost == 0 {
		c.Cost = defaults.Cost
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// policy builds the engine's policy, and the static limits of a request.
func (c *Config) policy() (limiter.Policy, []int64, []int64, error) {
	p := limiter.Policy{Name: c.Name, Burst: c.Burst, Regions: c.Region != nil, DryRun: c.DryRun,
		AppClock: c.Clock == "app", Now: c.Now, Concurrency: c.MaxConcurrent > 0, LeaseTimeout: c.LeaseTimeout}
	for _, e := range []struct {
		field, v string
		allowed  []string
	}{{"Fail", c.Fail, defaults.FailModes}, {"Clock", c.Clock, defaults.Clocks}, {"Headers", c.Headers, reply.HeaderModes}} {
		if !slices.Contains(e.allowed, e.v) {
			return p, nil, nil, configErr(e.field, "must be %s, got '%s'", strings.Join(e.allowed, ", "), e.v)
		}
	}
	var err error
	if c.Algorithm != "" {
		if p.Algorithm, err = limiter.ParseAlgorithm(c.Algorithm); err != nil {
			return p, nil, nil, configErr("Algorithm", "%v", err)
		}
	}
	if len(c.Limits) == 0 {
		return p, nil, nil, configErr("Limits", "at least one limit is required (Limits: []httplimit.Limit{{Limit: 100, Window: time.Minute}})")
	}
	var limits, globals []int64
	if p.Windows, limits, err = windows("Limits", c.Limits); err != nil {
		return p, nil, nil, err
	}
	if p.GlobalWindows, globals, err = windows("GlobalLimits", c.GlobalLimits); err != nil {
		return p, nil, nil, err
	}
	periods := reply.HasPeriod(p.Windows) || reply.HasPeriod(p.GlobalWindows)
	switch {
	case c.Timezone != "" && !periods:
		return p, nil, nil, configErr("Timezone", "applies to calendar periods (Period: \"day\"), and this limiter has none")
	case c.Timezone != "":
		if p.Location, err = time.LoadLocation(c.Timezone); err != nil {
			return p, nil, nil, configErr("Timezone", "unknown time zone '%s': %v", c.Timezone, err)
		}
	case periods:
		p.Location = time.UTC
	}
	if c.Ban != nil {
		p.Ban = &limiter.Ban{After: c.Ban.After, Within: c.Ban.Within, For: c.Ban.For}
	}
	if c.LeaseTimeout != 0 && c.MaxConcurrent <= 0 {
		return p, nil, nil, configErr("LeaseTimeout", "applies to MaxConcurrent, and this limiter has none")
	}
	trusted, err := ParsePrefixes("TrustedProxies", c.TrustedProxies)
	if err != nil {
		return p, nil, nil, err
	}
	if c.Key == nil {
		c.Key = ClientIP(trusted...)
	} else if len(trusted) > 0 {
		return p, nil, nil, configErr("TrustedProxies", "apply to the default Key (the client's IP); with a Key of your own, give them to ClientIP")
	}
	p.Fail, _ = limiter.ParseFailMode(c.Fail)
	if err := c.checkStore(&p); err != nil {
		return p, nil, nil, err
	}
	if err := p.Check(); err != nil {
		return p, nil, nil, policyError(err)
	}
	return p, limits, globals, c.checkCost(&p, limits, globals)
}

// windows is the engine's windows of field's limits, and their limits.
func windows(field string, ls []Limit) ([]limiter.Window, []int64, error) {
	var ws []limiter.Window
	var limits []int64
	for i, l := range ls {
		at := fmt.Sprintf("%s[%d]", field, i)
		w := limiter.Window{Duration: l.Window}
		switch {
		case l.Period != "" && l.Window != 0:
			return nil, nil, configErr(at, "give a Window or a Period, not both")
		case l.Period != "":
			p, ok := limiter.ParsePeriod(l.Period)
			if !ok {
				return nil, nil, configErr(at, "Period must be hour, day, week or month, got '%s'", l.Period)
			}
			w = limiter.Window{Period: p}
		case l.Window <= 0:
			return nil, nil, configErr(at, "limit %d has no window: give it a Window (time.Minute) or a Period (\"day\")", l.Limit)
		}
		if l.Limit < 1 || l.Limit > limiter.MaxValue {
			return nil, nil, configErr(at, "Limit must be a positive integer up to 2^50, got %d", l.Limit)
		}
		ws, limits = append(ws, w), append(limits, l.Limit)
	}
	return ws, limits, nil
}

// checkStore checks the options that apply to one kind of store, and
// sets the policy's store settings.
func (c *Config) checkStore(p *limiter.Policy) error {
	switch {
	case c.WarnAt > 1:
		return configErr("WarnAt", "must be a share of the limit, at most 1, got %g", c.WarnAt)
	case c.DenyCacheSize < -1:
		return configErr("DenyCacheSize", "must be -1 (off), 0 (default) or a size, got %d", c.DenyCacheSize)
	case c.DenyCacheSize != 0 && c.Redis == nil:
		return configErr("DenyCacheSize", "applies to a Redis store (the in-process store needs no cache)")
	case (c.Fail == "closed" || c.Fail == "local") && c.Redis == nil && c.GlobalRedis == nil:
		return configErr("Fail", "fail %s applies to a Redis store or a ledger (the in-process store does not fail)", c.Fail)
	case c.Cost < 1:
		return configErr("Cost", "must be a positive integer, got %d", c.Cost)
	case c.MaxConcurrent < 0:
		return configErr("MaxConcurrent", "must be positive, got %d", c.MaxConcurrent)
	}
	if c.Redis != nil {
		if e := c.Redis.Check(); e != nil {
			return redisErr("Redis", e)
		}
		p.KeyPrefix = c.Redis.KeyPrefix
		p.Timeout = c.Redis.DecisionTimeout()
	}
	if c.GlobalRedis == nil {
		if c.Datacenter != "" {
			return configErr("Datacenter", "names this node's data centre in the ledger of GlobalRedis, and this limiter has no GlobalRedis")
		}
		return nil
	}
	if e := c.GlobalRedis.CheckLedger(); e != nil {
		return redisErr("GlobalRedis", e)
	}
	if limiter.ValidName(c.Datacenter) != nil {
		return configErr("Datacenter", "GlobalRedis needs a Datacenter of 1 to 64 letters, digits, '_', '-' or '.', got '%s'", c.Datacenter)
	}
	if len(p.GlobalWindows) == 0 {
		return configErr("GlobalRedis", "keeps GlobalLimits across data centres, and this limiter has none")
	}
	return nil
}

// checkCost refuses a static cost that can never fit, and a sliding_log
// limit above what its log keeps.
func (c *Config) checkCost(p *limiter.Policy, limits, globals []int64) error {
	for i, l := range append(slices.Clone(limits), globals...) {
		field, w, global := "Limits", p.Windows, false
		if i >= len(limits) {
			field, w, global = "GlobalLimits", p.GlobalWindows, true
			i -= len(limits)
		}
		at := fmt.Sprintf("%s[%d]", field, i)
		if p.Algorithm == limiter.SlidingLog && w[i].Period == limiter.PeriodNone && c.Cost == 1 && c.CostFunc == nil && l > limiter.MaxLogEntries {
			return configErr(at, "limit %d on sliding_log: the log keeps one entry per request, at most %d per key and window; use sliding_counter for this rate", l, limiter.MaxLogEntries)
		}
		if capacity := p.Capacity(w[i], l, global); c.CostFunc == nil && c.Cost > capacity {
			return configErr("Cost", "cost %d is above %s's capacity %d: no request could ever pass", c.Cost, at, capacity)
		}
	}
	return nil
}

// redisErr names the field of a Redis configuration error.
func redisErr(field string, e *redisconf.Error) error {
	if e.Sub != "" {
		field += "." + e.Sub
	}
	return configErr(field, "%s", e.Msg)
}

// policyError names the field of an engine policy error.
func policyError(err error) error {
	var pe *limiter.PolicyError
	if !errors.As(err, &pe) {
		return fmt.Errorf("httplimit: %w", err)
	}
	field, ok := engineFields[pe.Field]
	if !ok {
		field = pe.Field
	}
	switch {
	case pe.Window > 0 && pe.Global:
		field = fmt.Sprintf("GlobalLimits[%d]", pe.Window-1)
	case pe.Window > 0:
		field = fmt.Sprintf("Limits[%d]", pe.Window-1)
	}
	return configErr(field, "%v", pe.Err)
}

// engineFields are the Config fields of the engine's policy fields.
var engineFields = map[string]string{"name": "Name", "algorithm": "Algorithm", "limit": "Limits", "global_limit": "GlobalLimits",
	"burst": "Burst", "ban": "Ban", "lease_timeout": "LeaseTimeout", "timeout": "Redis.Timeout"}
