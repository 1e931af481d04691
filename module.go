// Package slidingratelimit is a Caddy v2 HTTP handler that rate limits
// requests with an exact sliding-window log (and three other algorithms),
// on Redis (shared by every Caddy node) or on an in-process store (one
// Caddy, no Redis).
//
// This package is the Caddy adapter: configuration, Caddyfile, placeholders,
// responses, metrics and the admin API. Per request it resolves the
// placeholders, asks the Caddy-free engine in ./limiter once, and renders
// the Decision it returns.
package slidingratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/defaults"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redisconf"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults.
const (
	DefaultName        = defaults.Name
	DefaultKey         = "{http.vars.client_ip}"
	DefaultTimeout     = redisconf.DefaultTimeout
	DefaultDialTimeout = redisconf.DefaultDialTimeout
	DefaultWarnAt      = defaults.WarnAt
)

// Handler rate limits requests: it builds a key from placeholders, asks the
// engine whether one more request fits every limit, and either passes the
// request on or answers 429 with a precise Retry-After.
type Handler struct {
	// Name names the limiter: it is part of every key, the policy name in
	// the RateLimit headers, the label of its metrics and its path in the
	// admin API. Letters, digits, '_', '-' and '.'. Default: "default",
	// which two blocks of one config may not share.
	Name string `json:"name,omitempty"`

	// Algorithm counts the duration windows: "sliding_log" (exact),
	// "sliding_counter" (two counters, approximate), "fixed_window" or
	// "token_bucket". Calendar periods are always counted per period.
	// Default: "sliding_log".
	Algorithm string `json:"algorithm,omitempty"`

	// Key is the identity a budget belongs to, a template in which
	// placeholders are replaced per request, e.g.
	// "{http.request.header.X-API-Key}". A value that is long or holds '{',
	// '}', ':', '*' or control bytes is hashed before it is put in a store
	// key. The requests whose key expands to nothing share one bucket of
	// their own (counted in empty_keys_total); a key with no per-request
	// placeholder, or with one nothing provides, is warned about at load.
	// Default: "{http.vars.client_ip}".
	Key string `json:"key,omitempty"`

	// Region, when set, is a template (placeholders allowed) naming the
	// request's region: each (key, region) pair then has its own budget.
	Region string `json:"region,omitempty"`

	// Limit is the number of requests (units of cost) admitted per Window,
	// per key and region: a positive integer, or a placeholder resolved per
	// request (e.g. a tier set by Caddy's map handler); a placeholder that
	// does not resolve to a positive integer fails the request with 500 and
	// an error log, never "unlimited". Limit or Limits is required.
	Limit Amount `json:"limit,omitempty"`

	// Window is the length of the sliding window of Limit (and of
	// GlobalLimit), >= 1ms.
	Window caddy.Duration `json:"window,omitempty"`

	// Limits are more windows, each with its own limit: a request must fit
	// every one (and Limit), and one denied by any is recorded in none.
	Limits []LimitConfig `json:"limits,omitempty"`

	// GlobalLimit is an optional ceiling per key across all regions, over
	// Window, checked and recorded in the same atomic step as the region's
	// budget: a request must fit both. Requires Region. A positive integer
	// or a placeholder, as Limit.
	GlobalLimit Amount `json:"global_limit,omitempty"`

	// GlobalLimits are more windows of the global ceiling.
	GlobalLimits []LimitConfig `json:"global_limits,omitempty"`

	// Timezone is the IANA time zone of calendar periods (day, month...).
	// Default: UTC.
	Timezone string `json:"timezone,omitempty"`

	// Cost is the number of units one request consumes, for endpoints that
	// weigh more than one (a bulk call). A positive integer or a
	// placeholder, as Limit. Default 1. A request whose cost is above a
	// window's capacity can never pass and is answered 413.
	Cost Amount `json:"cost,omitempty"`

	// Burst is, for token_bucket with one duration window, the most units
	// admitted at once (the bucket's capacity); the steady rate stays limit
	// per window. Default: the limit.
	Burst int64 `json:"burst,omitempty"`

	// Ban puts a key denied After times within Within in a penalty box for
	// For: every request of the key is denied until then.
	Ban *BanConfig `json:"ban,omitempty"`

	// MaxConcurrent bounds the requests of a key (and region) in flight at
	// once, across every Caddy node sharing the store. A positive integer
	// or a placeholder, as Limit.
	MaxConcurrent Amount `json:"max_concurrent,omitempty"`

	// LeaseTimeout is how long a request in flight holds its place at most
	// (a node that dies holding places loses them after it). Default 1m.
	LeaseTimeout caddy.Duration `json:"lease_timeout,omitempty"`

	// CountOnly records a request's units only after its response, when
	// the status matches: codes ("401") or classes ("5xx"). The check before
	// the request denies a key already at its limit.
	CountOnly []string `json:"count_only,omitempty"`

	// Queue makes a request that would be denied wait for its turn, when
	// its Retry-After is at most MaxWait; at most MaxWaiters requests per
	// limiter and node wait at once.
	Queue *QueueConfig `json:"queue,omitempty"`

	// Jitter adds a random delay to the Retry-After of denials (and to the
	// RateLimit header's t): a duration ("2s") or a share of the retry time
	// ("10%").
	Jitter string `json:"jitter,omitempty"`

	// Fail is what happens when Redis cannot answer within its timeout (or
	// while the circuit breaker is open): "open" passes the request,
	// "closed" answers 503, "local" decides with the in-process store, per
	// Caddy instance, until Redis answers again. Default: "open".
	Fail string `json:"fail,omitempty"`

	// Clock chooses the clock of the decision: "redis" makes the script
	// read Redis TIME, so every Caddy node shares one clock; "app" uses
	// this process's clock. With the in-process store both mean this
	// process's clock. Default: "redis".
	Clock string `json:"clock,omitempty"`

	// Headers chooses the rate limit headers sent: "both", "ietf"
	// (RateLimit and RateLimit-Policy), "legacy" (X-RateLimit-Limit and
	// X-RateLimit-Remaining) or "off". Default: "both".
	Headers string `json:"headers,omitempty"`

	// WarnAt is the share of a limit (0 < warn_at <= 1) at which a request
	// counts as near the limit: {http.sliding_ratelimit.near_limit} is true,
	// and the request that crosses it increments near_limit_total and logs
	// a warning (rate-limited). Negative disables it. Default 0.85.
	WarnAt float64 `json:"warn_at,omitempty"`

	// LogKey adds the client's key to near-limit and dry-run log lines, to
	// events and to the admin API's top offenders (which otherwise show a
	// hash of it). Off by default: keys are often secrets.
	LogKey bool `json:"log_key,omitempty"`

	// DryRun counts and reports, never blocks: would-be denials pass, are
	// counted as dry_run_denial, logged, and set
	// {http.sliding_ratelimit.dry_run}; no rate limit headers are sent.
	DryRun bool `json:"dry_run,omitempty"`

	// OnLimit chooses how a refusal (429, 413, 503) is answered: "respond"
	// writes the JSON body (or a gRPC status); "error" returns a Caddy HTTP
	// error with the status, Retry-After and rate limit headers set, for
	// handle_errors to render. Default: "respond".
	OnLimit string `json:"on_limit,omitempty"`

	// DenyCacheSize bounds the over-limit cache in front of Redis: a key
	// denied until R is denied locally, without a Redis call, until R has
	// passed. 0 means the default (65536 keys); -1 turns it off.
	DenyCacheSize int `json:"deny_cache_size,omitempty"`

	// Redis configures the Redis store. Without it, the in-process store
	// is used: exact for this Caddy process, shared by nothing else.
	Redis *RedisConfig `json:"redis,omitempty"`

	// GlobalRedis is the ledger every data centre shares: with it, the
	// global ceiling (GlobalLimit, GlobalLimits) holds across data centres,
	// each keeping its region budgets in its own Redis and deciding
	// locally on a share of each identity's ceiling leased from the ledger
	// ahead of need. The same forms as Redis, but one Redis or a Sentinel
	// group (not a Cluster), and without the options of the request path
	// (pipeline, scripts) or key_prefix (the ledger's keys take the
	// limiter's namespace, from Redis's key_prefix and Name: give them the
	// same in every data centre). Its timeout bounds one ledger call
	// (default 1s), and its dial_timeout defaults to that timeout. Needs
	// Datacenter and a global limit; refused with CountOnly. Without Redis,
	// this node's in-process store keeps its data centre's share: each node
	// is then a data centre of its own, with a Datacenter of its own.
	GlobalRedis *RedisConfig `json:"global_redis,omitempty"`

	// Datacenter names this node's data centre in the ledger (GlobalRedis):
	// every node of one data centre, sharing its Redis, gives the same
	// name. 1 to 64 letters, digits, '_', '-' and '.'. Required with
	// GlobalRedis, refused without it.
	Datacenter string `json:"datacenter,omitempty"`

	// rt is what Provision builds from the configuration above.
	rt *provisioned
}

// LimitConfig is one window of a limiter and its limit.
type LimitConfig struct {
	// Limit is the units admitted per window: a positive integer or a
	// placeholder.
	Limit Amount `json:"limit"`
	// Window is the window's length (>= 1ms), or
	Window caddy.Duration `json:"window,omitempty"`
	// Period is a calendar period: "hour", "day", "week" or "month" in
	// Timezone; the count starts again at each period's start.
	Period string `json:"period,omitempty"`
}

// BanConfig is a penalty box.
type BanConfig struct {
	// For is how long a banned key stays banned.
	For caddy.Duration `json:"for"`
	// After is how many denials within Within ban a key.
	After int64 `json:"after"`
	// Within is the span the denials are counted over.
	Within caddy.Duration `json:"within"`
}

// QueueConfig lets denied requests wait for their turn.
type QueueConfig struct {
	// MaxWait is the longest a request waits in all.
	MaxWait caddy.Duration `json:"max_wait"`
	// MaxWaiters bounds the requests waiting at once per limiter and node
	// (the rest are refused at once). Default 1024.
	MaxWaiters int `json:"max_waiters,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sliding_ratelimit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills in defaults, builds the engine and opens (or shares) its
// store.
func (h *Handler) Provision(ctx caddy.Context) (err error) {
	h.rt = newProvisioned(ctx, h.rt)
	h.setDefaults()
	h.rt.top = sharedOffenders(h.Name)
	p, err := h.policy()
	if err != nil {
		return h.named(err)
	}
	if err := h.checkStatic(&p); err != nil {
		return h.named(err)
	}
	if err := h.checkAmounts(); err != nil {
		return h.named(err)
	}
	if err := h.checkAuthOrder(); err != nil {
		return h.named(err)
	}
	h.rt.policy = p
	h.compile()
	h.rt.statusIn = p.CountOnly

	storeLabel := "memory"
	if h.Redis != nil {
		storeLabel = "redis"
	}
	h.rt.metrics = newLimiterMetrics(h.Name, storeLabel)
	if h.GlobalRedis != nil {
		h.rt.metrics.Global = newGlobalMetrics(h.Name, h.Datacenter, p.GlobalWindows)
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("sliding_ratelimit: metrics: %w", err)
	}
	// Events go out only when an events app is configured.
	if ev, err := ctx.AppIfConfigured("events"); err == nil {
		h.rt.events, _ = ev.(*caddyevents.App)
	}

	b, err := h.backend()
	if err != nil {
		return err
	}
	if h.rt.lim, err = limiter.New(p, b); err != nil {
		h.release()
		return h.named(h.policyError(err))
	}
	if err := h.checkAccess(); err != nil {
		h.rt.lim.Close()
		h.release()
		return h.named(err)
	}
	h.rt.headers = planHeaders(h, &p)
	h.rt.refusals.WithRegion = h.Region != ""
	h.rt.configID = ctx.GetMetricsRegistry()
	h.warnRestart(&p)
	cfg, _ := json.Marshal(h)
	h.rt.fingerprt = string(cfg)
	first, err := register(h)
	if err != nil {
		h.rt.lim.Close()
		h.release()
		return h.named(err)
	}
	if first {
		// Once per limiter and config, however many routes hold it.
		h.warnTemplates()
	}
	return nil
}

// setDefaults fills in the defaults of the fields left unset.
func (h *Handler) setDefaults() {
	if h.Name == "" {
		h.Name = DefaultName
	}
	if h.Key == "" {
		h.Key = DefaultKey
	}
	if h.Fail == "" {
		h.Fail = defaults.Fail
	}
	if h.Clock == "" {
		h.Clock = defaults.Clock
	}
	if h.Headers == "" {
		h.Headers = defaults.Headers
	}
	if h.OnLimit == "" {
		h.OnLimit = "respond"
	}
	if h.WarnAt == 0 {
		h.WarnAt = DefaultWarnAt
	}
	if h.Redis != nil {
		h.Redis.provision()
	}
	if h.GlobalRedis != nil {
		h.GlobalRedis.provision()
	}
}

// Validate checks the configuration (every value, whichever way it came:
// JSON or the Caddyfile).
func (h *Handler) Validate() error {
	return h.named(h.validate())
}

// validate is Validate with errors that name the field at fault, not the
// limiter (the Caddyfile parser gives the line instead).
func (h *Handler) validate() error {
	if h.rt != nil && h.rt.lim != nil {
		// Provision built the policy of this load and checked it
		// (limiter.New runs Check): it is not built twice.
		return nil
	}
	p, err := h.policy()
	if err != nil {
		return err
	}
	if err := p.Check(); err != nil {
		return h.policyError(err)
	}
	return h.checkStatic(&p)
}

// named adds the limiter's name to a configuration error, for the errors
// no Caddyfile line points at (a JSON config, what only loading finds).
func (h *Handler) named(err error) error {
	var ce *configError
	if !errors.As(err, &ce) {
		return err
	}
	c := *ce
	c.limiter = h.Name
	if c.limiter == "" {
		c.limiter = DefaultName
	}
	return &c
}

// Cleanup releases this handler's use of its stores, once its requests
// in flight are done (releaseAfterDone).
func (h *Handler) Cleanup() error {
	if h.rt == nil { // never provisioned
		return nil
	}
	unregister(h)
	if h.rt.lim == nil {
		return h.release()
	}
	h.rt.lim.Close()
	return h.releaseAfterDone()
}

// release gives back the stores taken in Provision.
func (h *Handler) release() error {
	keys := []string{h.rt.storeKey, h.rt.localKey, h.rt.ledgerKey}
	h.rt.storeKey, h.rt.localKey, h.rt.ledgerKey = "", "", ""
	return releaseStores(keys)
}

// The values of the enumerated subdirectives.
var (
	failModes   = defaults.FailModes
	clocks      = defaults.Clocks
	headerModes = reply.HeaderModes
	onLimits    = []string{"respond", "error"}
)

// oneOf checks that v is one of allowed: "fail must be open, closed or
// local, got 'x'" otherwise.
func oneOf(what, v string, allowed ...string) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	list := strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
	return fmt.Errorf("%s must be %s, got '%s'", what, list, v)
}

// enum returns the field of an enumerated subdirective and its values.
func (h *Handler) enum(name string) (*string, []string) {
	switch name {
	case "fail":
		return &h.Fail, failModes
	case "clock":
		return &h.Clock, clocks
	case "headers":
		return &h.Headers, headerModes
	case "on_limit":
		return &h.OnLimit, onLimits
	}
	panic("sliding_ratelimit: no enumerated subdirective " + name)
}

// configError is a configuration error that names the field at fault
// (limit, limits[1], redis.timeout, ...): the Caddyfile parser points at
// the line that set it, and a JSON config's error names it.
type configError struct {
	field   string
	limiter string // the limiter's name, when no line points at it
	err     error
}

func (e *configError) Error() string {
	prefix := "sliding_ratelimit: "
	if e.limiter != "" {
		prefix += "limiter " + e.limiter + ": "
	}
	msg := e.err.Error()
	field := jsonField(e.field)
	// "limit must be ..." names its field already; "window must be ..." of
	// limits[1] does not, nor "redis: bad URL" its redis.url.
	if top, _, nested := strings.Cut(field, "."); nested && strings.HasPrefix(msg, top+": ") {
		msg = msg[len(top)+2:]
	}
	if field == "" || strings.HasPrefix(msg, field) {
		return prefix + msg
	}
	return prefix + field + ": " + msg
}

func (e *configError) Unwrap() error { return e.err }

// jsonField is the JSON name of a configuration field as configError
// names it (the Caddyfile subdirective, where the two differ).
func jsonField(field string) string {
	switch field {
	case "deny_cache":
		return "deny_cache_size"
	case "redis.address":
		return "redis.addresses"
	case "global_redis.address":
		return "global_redis.addresses"
	case "timeout", "key_prefix":
		return "redis." + field
	}
	return field
}

func cfgErr(field, format string, args ...any) error {
	return &configError{field: field, err: fmt.Errorf(format, args...)}
}

// policyError names the configuration field of an engine policy error.
func (h *Handler) policyError(err error) error {
	var pe *limiter.PolicyError
	if errors.As(err, &pe) {
		field := pe.Field
		if pe.Window > 0 {
			field = h.windowField(pe.Global, pe.Window-1, pe.Field == "window")
		}
		return &configError{field: field, err: pe.Err}
	}
	return fmt.Errorf("sliding_ratelimit: %w", err)
}

// windowField names the field that gives the i-th window (0-based) of the
// bucket's or the global windows: Limit (and, for its duration, Window)
// first when set, then Limits[j] ("limits[j]").
func (h *Handler) windowField(global bool, i int, duration bool) string {
	first, name := h.Limit, "limit"
	if global {
		first, name = h.GlobalLimit, "global_limit"
	}
	if first != "" {
		if i == 0 {
			if duration {
				return "window"
			}
			return name
		}
		i--
	}
	return fmt.Sprintf("%ss[%d]", name, i)
}

// windows lists the limiter's windows with their amounts (bucket or
// global).
func (h *Handler) windows(global bool) ([]limiter.Window, []Amount, error) {
	first, extra := h.Limit, h.Limits
	field := "limit"
	if global {
		first, extra, field = h.GlobalLimit, h.GlobalLimits, "global_limit"
	}
	var ws []limiter.Window
	var as []Amount
	if first != "" {
		ws, as = append(ws, limiter.Window{Duration: time.Duration(h.Window)}), append(as, first)
		if h.Window == 0 {
			return nil, nil, cfgErr(field, "%s %s has no window: set window, or give it one (%s %s 1m)", field, first, field, first)
		}
	}
	for _, l := range extra {
		w := limiter.Window{Duration: time.Duration(l.Window)}
		if l.Period != "" {
			p, ok := limiter.ParsePeriod(l.Period)
			if !ok || l.Window != 0 {
				return nil, nil, cfgErr(h.windowField(global, len(ws), false), "%s %s: a window is a duration or one of hour, day, week, month, got '%s'", field, l.Limit, l.Period)
			}
			w = limiter.Window{Period: p}
		} else if l.Window == 0 {
			return nil, nil, cfgErr(h.windowField(global, len(ws), false), "%s %s has no window: give it a duration or a calendar period", field, l.Limit)
		}
		ws, as = append(ws, w), append(as, l.Limit)
	}
	for i, a := range as {
		if err := a.checkStatic(field); err != nil {
			return nil, nil, &configError{field: h.windowField(global, i, false), err: err}
		}
	}
	return ws, as, nil
}

// policy builds the engine's policy from the configuration; Validate
// checks it, Provision runs it.
func (h *Handler) policy() (limiter.Policy, error) {
	var p limiter.Policy
	p.Name = h.Name
	if p.Name == "" {
		p.Name = DefaultName
	}
	for _, e := range []struct{ name, v string }{{"fail", h.Fail}, {"clock", h.Clock}, {"headers", h.Headers}, {"on_limit", h.OnLimit}} {
		if e.v == "" {
			continue
		}
		_, allowed := h.enum(e.name)
		if err := oneOf(e.name, e.v, allowed...); err != nil {
			return p, &configError{field: e.name, err: err}
		}
	}
	if err := h.policyWindows(&p); err != nil {
		return p, err
	}
	if err := h.policyRequests(&p); err != nil {
		return p, err
	}
	if err := h.policyStore(&p); err != nil {
		return p, err
	}
	p.DryRun = h.DryRun
	p.AppClock = h.Clock == "app"
	if h.rt != nil {
		p.Now = h.rt.now
	}
	return p, nil
}

// policyWindows sets the policy's algorithm, windows, burst, regions and
// time zone.
func (h *Handler) policyWindows(p *limiter.Policy) error {
	var err error
	if h.Algorithm != "" {
		if p.Algorithm, err = limiter.ParseAlgorithm(h.Algorithm); err != nil {
			return &configError{field: "algorithm", err: err}
		}
	}
	if h.Limit == "" && len(h.Limits) == 0 {
		return cfgErr("limit", "limit is required")
	}
	if p.Windows, _, err = h.windows(false); err != nil {
		return err
	}
	if p.GlobalWindows, _, err = h.windows(true); err != nil {
		return err
	}
	if h.Window != 0 && h.Limit == "" && h.GlobalLimit == "" {
		return cfgErr("window", "window is the window of limit <n> (and global_limit <n>), and every limit here has a window of its own: drop window")
	}
	if h.Algorithm != "" && p.Algorithm != limiter.FixedWindow && !hasDuration(p.Windows) {
		return cfgErr("algorithm", "algorithm %s applies to duration windows, and this limiter has only calendar periods (counted per period, as fixed windows): drop algorithm", h.Algorithm)
	}
	p.Burst = h.Burst
	p.Regions = h.Region != ""
	if h.Timezone != "" {
		if p.Location, err = time.LoadLocation(h.Timezone); err != nil {
			return cfgErr("timezone", "unknown time zone '%s': %v", h.Timezone, err)
		}
	} else if hasPeriod(p.Windows) || hasPeriod(p.GlobalWindows) {
		p.Location = time.UTC
	}
	if h.Timezone != "" && !hasPeriod(p.Windows) && !hasPeriod(p.GlobalWindows) {
		return cfgErr("timezone", "timezone applies to calendar periods (limit <n> day), and this limiter has none")
	}
	return nil
}

// policyRequests sets what the policy does with a request beyond counting
// it: ban, concurrency, count_only, queue, jitter; and checks the cost.
func (h *Handler) policyRequests(p *limiter.Policy) error {
	var err error
	if h.Ban != nil {
		p.Ban = &limiter.Ban{After: h.Ban.After, Within: time.Duration(h.Ban.Within), For: time.Duration(h.Ban.For)}
	}
	p.Concurrency = h.MaxConcurrent != ""
	if err := h.MaxConcurrent.checkStatic("max_concurrent"); err != nil {
		return &configError{field: "max_concurrent", err: err}
	}
	if h.LeaseTimeout != 0 && !p.Concurrency {
		return cfgErr("lease_timeout", "lease_timeout applies to max_concurrent, and this limiter has none")
	}
	p.LeaseTimeout = time.Duration(h.LeaseTimeout)
	if len(h.CountOnly) > 0 {
		match, err := statusMatcher(h.CountOnly)
		if err != nil {
			return &configError{field: "count_only", err: err}
		}
		p.CountOnly = match
	}
	if q := h.Queue; q != nil {
		if q.MaxWait <= 0 || q.MaxWaiters < 0 {
			return cfgErr("queue", "queue needs a positive max wait and a positive number of waiters, got %s and %d", time.Duration(q.MaxWait), q.MaxWaiters)
		}
		p.Queue = limiter.Queue{MaxWait: time.Duration(q.MaxWait), MaxWaiters: q.MaxWaiters}
	}
	if h.Jitter != "" {
		if p.Jitter, err = parseJitter(h.Jitter); err != nil {
			return &configError{field: "jitter", err: err}
		}
	}
	if err := h.Cost.checkStatic("cost"); err != nil {
		return &configError{field: "cost", err: err}
	}
	return nil
}

// policyStore sets the policy's store settings (key prefix, timeout, fail
// mode) and checks the options that apply to one kind of store.
func (h *Handler) policyStore(p *limiter.Policy) error {
	if h.WarnAt > 1 {
		return cfgErr("warn_at", "warn_at must be a share of the limit, at most 1, got %g", h.WarnAt)
	}
	if h.DenyCacheSize < -1 {
		return cfgErr("deny_cache", "deny_cache_size must be -1 (off), 0 (default) or a size, got %d", h.DenyCacheSize)
	}
	if h.DenyCacheSize != 0 && h.Redis == nil {
		return cfgErr("deny_cache", "deny_cache applies to a Redis store (the in-process store needs no cache)")
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			return err
		}
		p.KeyPrefix = h.Redis.KeyPrefix
		p.Timeout = h.Redis.timeout()
	}
	if fail, _ := limiter.ParseFailMode(h.Fail); h.Fail != "" {
		p.Fail = fail
	}
	if err := h.policyGlobal(p); err != nil {
		return err
	}
	if (h.Fail == "closed" || h.Fail == "local") && h.Redis == nil && h.GlobalRedis == nil {
		return cfgErr("fail", "fail %s applies to a Redis store or a ledger (the in-process store does not fail)", h.Fail)
	}
	if h.Clock == "app" && h.Redis == nil {
		return cfgErr("clock", "clock app applies to a Redis store (the in-process store always uses Caddy's clock)")
	}
	return nil
}

// policyGlobal checks global_redis and datacenter (the engine refuses the
// same when it starts the ledger; checked here, the Caddyfile points at
// the line).
func (h *Handler) policyGlobal(p *limiter.Policy) error {
	if h.GlobalRedis == nil {
		if h.Datacenter != "" {
			return cfgErr("datacenter", "datacenter names this node's data centre in the ledger of global_redis, and this limiter has no global_redis: drop datacenter, or add global_redis")
		}
		return nil
	}
	if err := h.GlobalRedis.checkLedger(); err != nil {
		return err
	}
	if h.Datacenter == "" {
		return cfgErr("global_redis", "global_redis needs datacenter <name>: this node's data centre, the same on every node sharing its redis")
	}
	if err := validDatacenter(h.Datacenter); err != nil {
		return &configError{field: "datacenter", err: err}
	}
	if len(p.GlobalWindows) == 0 {
		return cfgErr("global_redis", "global_redis keeps the global_limit's windows across data centres, and this limiter has no global_limit: add one (global_limit 1000 1m), or drop global_redis")
	}
	if p.CountOnly != nil {
		return cfgErr("global_redis", "global_redis cannot keep a ceiling across data centres exactly with count_only (it records after the response): drop count_only or global_redis")
	}
	return nil
}

// validDatacenter checks a data centre's name: the rule of limiter names.
func validDatacenter(dc string) error {
	if limiter.ValidName(dc) != nil {
		return fmt.Errorf("datacenter '%s' must be 1 to 64 letters, digits, '_', '-' or '.' (no spaces, braces or colons)", dc)
	}
	return nil
}

func hasPeriod(ws []limiter.Window) bool { return reply.HasPeriod(ws) }

func hasDuration(ws []limiter.Window) bool {
	for _, w := range ws {
		if w.Period == limiter.PeriodNone {
			return true
		}
	}
	return false
}

// checkStatic refuses, at load, a static cost that can never fit a static
// limit (the engine answers 413 for dynamic ones per request).
func (h *Handler) checkStatic(p *limiter.Policy) error {
	cost := compileAmount(h.Cost, 1)
	if cost.tmpl != "" {
		return nil
	}
	_, as, _ := h.windows(false)
	_, gs, _ := h.windows(true)
	for i, a := range append(as, gs...) {
		c := compileAmount(a, 0)
		if c.tmpl != "" {
			continue
		}
		w := p.Windows
		field := "limit"
		if i >= len(as) {
			w, field = p.GlobalWindows, "global_limit"
			i -= len(as)
		}
		capacity := p.Capacity(w[i], c.static, field == "global_limit")
		if p.Algorithm == limiter.SlidingLog && w[i].Period == limiter.PeriodNone && cost.static == 1 && c.static > limiter.MaxLogEntries {
			return cfgErr(h.windowField(field == "global_limit", i, false), "%s %d on sliding_log: the log keeps one entry per request, at most %d per key and window (more would hold Redis for milliseconds); use sliding_counter (O(1) per key) for this rate, or a cost per request", field, c.static, limiter.MaxLogEntries)
		}
		if cost.static > capacity {
			what := fmt.Sprintf("%s %d", field, c.static)
			if capacity != c.static {
				what = fmt.Sprintf("burst %d", capacity)
			}
			return cfgErr("cost", "cost %d is above %s: no request could ever pass", cost.static, what)
		}
	}
	return nil
}

// compile readies the templates and amounts for the hot path.
func (h *Handler) compile() {
	_, as, _ := h.windows(false)
	_, gs, _ := h.windows(true)
	h.rt.limits, h.rt.globals = nil, nil
	for _, a := range as {
		h.rt.limits = append(h.rt.limits, compileAmount(a, 0))
	}
	for _, a := range gs {
		h.rt.globals = append(h.rt.globals, compileAmount(a, 0))
	}
	h.rt.cost = compileAmount(h.Cost, 1)
	h.rt.concurrent = compileAmount(h.MaxConcurrent, 0)
	h.rt.keyTmpl = compileTemplate(h.Key)
	h.rt.keyHeader = headerField(h.rt.keyTmpl)
	h.rt.regionTmpl = compileTemplate(h.Region)
}

// headerField is, for a template that is just {http.request.header.<field>},
// the field as Caddy's placeholder looks it up (canonical form); "" for
// any other template.
func headerField(t template) string {
	field, ok := strings.CutPrefix(t.single, "http.request.header.")
	if !ok {
		return ""
	}
	return textproto.CanonicalMIMEHeaderKey(field)
}

// warnRestart logs, at a reload, what makes every budget of the limiter
// start again: its keys change (another algorithm, key prefix, key or
// region template), so the state under the old keys is not read. Windows
// and limits that change keep their budgets (see the README).
func (h *Handler) warnRestart(p *limiter.Policy) {
	prev := predecessor(h)
	if prev == nil {
		return
	}
	old := prev.rt.lim.Policy()
	var changed []string
	if old.Algorithm != p.Algorithm {
		changed = append(changed, "algorithm "+old.Algorithm.String()+" -> "+p.Algorithm.String())
	}
	if prev.rt.lim.Keys().Namespace() != h.rt.lim.Keys().Namespace() {
		changed = append(changed, "key_prefix")
	}
	if prev.Key != h.Key {
		changed = append(changed, "key")
	}
	if prev.Region != h.Region {
		changed = append(changed, "region")
	}
	if len(changed) > 0 {
		h.rt.logger.Warn("limiter's keys changed at this reload: every client's budget starts again",
			zap.String("limiter", h.Name), zap.Strings("changed", changed))
	}
}

// statusMatcher compiles count_only's codes (401) and classes (5xx).
func statusMatcher(list []string) (func(int) bool, error) {
	var codes []int
	var classes []int
	for _, s := range list {
		if len(s) == 3 && s[1:] == "xx" && s[0] >= '1' && s[0] <= '5' {
			classes = append(classes, int(s[0]-'0'))
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 || n > 599 {
			return nil, fmt.Errorf("count_only status takes codes (401) or classes (5xx), got '%s'", s)
		}
		codes = append(codes, n)
	}
	return func(status int) bool {
		return slices.Contains(codes, status) || slices.Contains(classes, status/100)
	}, nil
}

// parseJitter reads "2s" (up to 2 s) or "10%" (up to 10% of the retry).
func parseJitter(s string) (limiter.Jitter, error) {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f <= 0 || f > 1000 {
			return limiter.Jitter{}, fmt.Errorf("jitter must be a duration or a percentage in (0, 1000], got '%s'", s)
		}
		return limiter.Jitter{Share: f / 100}, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil || d <= 0 {
		return limiter.Jitter{}, fmt.Errorf("jitter must be a duration or a percentage, got '%s'", s)
	}
	return limiter.Jitter{Max: d}, nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
