// Package slidingratelimit is a Caddy v2 HTTP handler that rate limits
// requests with an exact sliding-window log, on Redis (shared by every Caddy
// node) or on an in-process store (one Caddy, no Redis).
//
// This package is the Caddy adapter: configuration, Caddyfile, placeholders
// and responses. Decisions come from the Caddy-free engine in ./limiter.
package slidingratelimit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults.
const (
	DefaultName        = "default"
	DefaultKey         = "{http.vars.client_ip}"
	DefaultTimeout     = 100 * time.Millisecond
	DefaultDialTimeout = 250 * time.Millisecond
	DefaultPoolSize    = 0 // go-redis default: 10 per CPU
	DefaultWarnAt      = 0.85
)

// Handler rate limits requests: it builds a key from placeholders, asks the
// store whether one more request fits the limit, and either passes the
// request on or answers 429 with a precise Retry-After.
type Handler struct {
	// Name names the limiter: it is part of every key, the policy name in
	// the RateLimit headers and the label of its metrics. Letters, digits,
	// '_', '-' and '.'. Default: "default".
	Name string `json:"name,omitempty"`

	// Algorithm is the counting scheme: "sliding_log" (exact sliding
	// window log). Default: "sliding_log".
	Algorithm string `json:"algorithm,omitempty"`

	// Key is the identity a budget belongs to, a template in which
	// placeholders are replaced per request, e.g. "{http.request.header.X-API-Key}".
	// A value that is long or holds '{', '}', ':', '*' or control bytes is
	// hashed before it is put in a store key. A key that expands to nothing
	// is a bucket of its own. Default: "{http.vars.client_ip}".
	Key string `json:"key,omitempty"`

	// Region, when set, is a template (placeholders allowed) naming the
	// request's region: each (key, region) pair then has its own budget.
	Region string `json:"region,omitempty"`

	// Limit is the number of requests (units of cost) admitted per window,
	// per key and region. Required: a positive integer, or a placeholder
	// resolved per request (e.g. a tier set by Caddy's map handler); a
	// placeholder that does not resolve to a positive integer fails the
	// request with 500 and an error log, never "unlimited".
	Limit Amount `json:"limit,omitempty"`

	// GlobalLimit is an optional ceiling per key across all regions,
	// checked and recorded in the same atomic step as the region's budget:
	// a request must fit both. Requires Region. A positive integer or a
	// placeholder, as Limit.
	GlobalLimit Amount `json:"global_limit,omitempty"`

	// Cost is the number of units one request consumes, for endpoints that
	// weigh more than one (a bulk call). A positive integer or a
	// placeholder, as Limit. Default 1. A request whose cost is above the
	// limit can never pass and is answered 413.
	Cost Amount `json:"cost,omitempty"`

	// Window is the length of the sliding window. Required, >= 1ms.
	Window caddy.Duration `json:"window,omitempty"`

	// Fail is what happens when Redis cannot answer within its timeout (or
	// while the circuit breaker is open): "open" passes the request,
	// "closed" answers 503, "local" decides with the in-process store, per
	// Caddy instance, until Redis answers again. Default: "open".
	Fail string `json:"fail,omitempty"`

	// Clock chooses the clock of the decision: "redis" makes the script read
	// Redis TIME, so every Caddy node shares one clock; "app" uses this
	// process's clock. With the in-process store both mean this process's
	// clock. Default: "redis".
	Clock string `json:"clock,omitempty"`

	// Headers chooses the rate limit headers sent: "both", "ietf"
	// (RateLimit and RateLimit-Policy), "legacy" (X-RateLimit-Limit and
	// X-RateLimit-Remaining) or "off". Default: "both".
	Headers string `json:"headers,omitempty"`

	// Burst is, for token_bucket, the most requests admitted at once (the
	// bucket's capacity); the steady rate stays limit per window.
	// Default: limit.
	Burst int64 `json:"burst,omitempty"`

	// WarnAt is the share of a limit (0 < warn_at <= 1) at which a request
	// counts as near the limit: {http.sliding_ratelimit.near_limit} is true,
	// and the request that crosses it increments near_limit_total and logs
	// a warning (rate-limited). Negative disables it. Default 0.85.
	WarnAt float64 `json:"warn_at,omitempty"`

	// LogKey adds the client's key to near-limit and dry-run log lines and
	// to events. Off by default: keys are often secrets.
	LogKey bool `json:"log_key,omitempty"`

	// DryRun counts and reports, never blocks: would-be denials pass, are
	// counted as dry_run_denial, logged, and set
	// {http.sliding_ratelimit.dry_run}; no rate limit headers are sent.
	DryRun bool `json:"dry_run,omitempty"`

	// OnLimit chooses the denial: "respond" writes the JSON 429; "error"
	// returns a Caddy HTTP error (status 429, Retry-After set) for
	// handle_errors to render. Default: "respond".
	OnLimit string `json:"on_limit,omitempty"`

	// DenyCacheSize bounds the over-limit cache in front of Redis: a key
	// denied with retry-after R is denied locally, without a Redis call,
	// until R has passed. 0 means the default (65536 keys); -1 turns it off.
	DenyCacheSize int `json:"deny_cache_size,omitempty"`

	// Redis configures the Redis store. Without it, the in-process store
	// is used: exact for this Caddy process, shared by nothing else.
	Redis *RedisConfig `json:"redis,omitempty"`

	alg        limiter.Algorithm
	limit      amount
	global     amount
	cost       amount
	hasGlobal  bool
	keyTmpl    template
	regionTmpl template
	keys       limiter.KeyBuilder
	store      limiter.Store
	poolKey    string // the store's entry in its pool, released in Cleanup
	timeout    time.Duration
	source     string // "redis" or "memory"
	failOpen   bool
	breaker    *limiter.Breaker
	// circuitSeen is the breaker state last written to the circuit gauge
	// (atomic).
	circuitSeen int32
	denyCache   *limiter.DenyCache
	metrics     *limiterMetrics
	warnLog     *burstLogger
	dryLog      *burstLogger
	eventGate   *burstLogger
	events      *caddyevents.App
	ctx         caddy.Context
	local       limiter.Store // fail local: the in-process store
	localKey    string
	clockApp    bool
	legacyHdr   bool
	ietfHdr     bool
	policy      string      // RateLimit-Policy, when the limits are static
	limitVal    headerValue // X-RateLimit-Limit of the bucket, when static
	now         func() time.Time
	logger      *zap.Logger
	errLog      *burstLogger // store errors
	cfgLog      *burstLogger // placeholders that did not resolve
}

// RedisConfig is the Redis the limiter keeps its state in.
type RedisConfig struct {
	// URL is a redis:// or rediss:// URL (user, password, host, port and
	// db). Either URL or Addresses.
	URL string `json:"url,omitempty"`

	// Addresses lists host:port of the Redis server. Several addresses make
	// a Redis Cluster client (any reachable nodes of the cluster; the rest
	// are discovered). With Sentinel, they are the Sentinels. Either URL or
	// Addresses.
	Addresses []string `json:"addresses,omitempty"`

	// Cluster makes a Redis Cluster client even with one address (a
	// cluster's configuration endpoint). Several addresses imply it.
	Cluster bool `json:"cluster,omitempty"`

	// Sentinel, when set, is the master name monitored by the Sentinels at
	// Addresses: the client follows failovers.
	Sentinel string `json:"sentinel,omitempty"`

	// SentinelPassword authenticates to the Sentinels, if they need it.
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// Username is the ACL user, if any.
	Username string `json:"username,omitempty"`

	// Password authenticates the connection. Caddyfile {$ENV} placeholders
	// work as anywhere in a Caddyfile.
	Password string `json:"password,omitempty"`

	// DB is the database number (not on a cluster). Default 0.
	DB int `json:"db,omitempty"`

	// TLS, when present, connects with TLS (rediss:// URLs do too).
	TLS *RedisTLS `json:"tls,omitempty"`

	// DialTimeout bounds connecting to Redis. Default 250ms.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// Timeout bounds one decision: the whole call to Redis, including
	// waiting for a pooled connection. When it passes, the fail mode
	// applies. Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// PoolSize is the maximum number of connections. Default: go-redis's
	// default of 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Pipeline is the number of concurrent pipelines that carry the checks
	// of concurrent requests to Redis in batches (each check still its own
	// atomic script): far fewer round trips and system calls under load, at
	// the cost of waiting for the batch in flight. -1 sends every check on
	// its own. Default 2.
	Pipeline int `json:"pipeline,omitempty"`

	// KeyPrefix starts every key the limiter writes. It must not contain
	// '{' or '}'. Default "ratelimit:".
	KeyPrefix string `json:"key_prefix,omitempty"`
}

// RedisTLS configures TLS to Redis. An empty block uses the system roots.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities to trust instead of
	// the system roots.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate, for Redis
	// servers that require one (tls-auth-clients).
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName overrides the name checked in the server's certificate.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// tlsConfig loads the files into a *tls.Config.
func (t *RedisTLS) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // an explicit, documented option
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca: no PEM certificate in %s", t.CA)
		}
		cfg.RootCAs = pool
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("tls: cert and key go together")
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls cert/key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sliding_ratelimit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills in defaults and opens (or shares) the store.
func (h *Handler) Provision(ctx caddy.Context) (err error) {
	h.logger = ctx.Logger()
	h.ctx = ctx
	h.errLog = &burstLogger{every: 10 * time.Second}
	h.cfgLog = &burstLogger{every: 10 * time.Second}
	h.warnLog = &burstLogger{every: 10 * time.Second}
	h.dryLog = &burstLogger{every: 10 * time.Second}
	h.eventGate = &burstLogger{every: 10 * time.Second}
	if h.WarnAt == 0 {
		h.WarnAt = DefaultWarnAt
	}
	if h.OnLimit == "" {
		h.OnLimit = "respond"
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.Name == "" {
		h.Name = DefaultName
	}
	if h.Algorithm == "" {
		h.Algorithm = limiter.SlidingLog.String()
	}
	if h.Key == "" {
		h.Key = DefaultKey
	}
	if h.Fail == "" {
		h.Fail = "open"
	}
	if h.Clock == "" {
		h.Clock = "redis"
	}
	if h.Headers == "" {
		h.Headers = "both"
	}
	if err := h.checkEnums(); err != nil {
		return err
	}
	var alg limiter.Algorithm
	alg, err = limiter.ParseAlgorithm(h.Algorithm)
	if err != nil {
		return fmt.Errorf("sliding_ratelimit: algorithm: %w", err)
	}
	h.alg = alg
	prefix := limiter.DefaultKeyPrefix
	if h.Redis != nil && h.Redis.KeyPrefix != "" {
		prefix = h.Redis.KeyPrefix
	}
	if h.keys, err = limiter.NewKeyBuilder(prefix, h.Name, alg); err != nil {
		return fmt.Errorf("sliding_ratelimit: %w", err)
	}
	h.failOpen = h.Fail == "open"
	h.clockApp = h.Clock == "app"
	h.legacyHdr = h.Headers == "both" || h.Headers == "legacy"
	h.ietfHdr = h.Headers == "both" || h.Headers == "ietf"
	h.limit = compileAmount(h.Limit, 0)
	h.global = compileAmount(h.GlobalLimit, 0)
	h.cost = compileAmount(h.Cost, 1)
	h.hasGlobal = h.GlobalLimit != ""
	h.keyTmpl = compileTemplate(h.Key)
	h.regionTmpl = compileTemplate(h.Region)
	if h.limit.tmpl == "" && h.global.tmpl == "" {
		h.policy = h.policyHeader(h.limit.static, h.global.static)
	}
	if h.limit.tmpl == "" {
		capacity := h.limit.static
		if alg == limiter.TokenBucket && h.Burst > 0 {
			capacity = h.Burst
		}
		h.limitVal = headerValue{n: capacity, s: strconv.FormatInt(capacity, 10)}
	}

	storeLabel := "memory"
	if h.Redis != nil {
		storeLabel = "redis"
	}
	h.metrics = newLimiterMetrics(h.Name, storeLabel)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("sliding_ratelimit: metrics: %w", err)
	}
	// Events go out only when an events app is configured (with subscribers).
	if ev, err := ctx.AppIfConfigured("events"); err == nil {
		h.events, _ = ev.(*caddyevents.App)
	}
	defer func() {
		if err == nil {
			register(h)
		}
	}()

	if h.Redis == nil {
		h.store, h.poolKey, err = acquireMemoryStore()
		h.source = "memory"
		return err
	}
	h.timeout = DefaultTimeout
	if h.Redis.Timeout > 0 {
		h.timeout = time.Duration(h.Redis.Timeout)
	}
	h.breaker, h.poolKey, err = acquireRedisStore(h.Redis)
	h.source = "redis"
	if err != nil {
		return fmt.Errorf("sliding_ratelimit: redis: %w", err)
	}
	h.store = h.breaker
	if h.DenyCacheSize >= 0 {
		h.denyCache = limiter.NewDenyCache(h.breaker, h.DenyCacheSize, nil)
		h.store = h.denyCache
	}
	if h.Fail == "local" {
		if h.local, h.localKey, err = acquireMemoryStore(); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the configuration's ranges.
func (h *Handler) Validate() error {
	if err := h.checkAmounts(); err != nil {
		return err
	}
	if time.Duration(h.Window) < time.Millisecond {
		return fmt.Errorf("sliding_ratelimit: window must be at least 1ms, got %s", time.Duration(h.Window))
	}
	if err := h.checkEnums(); err != nil {
		return err
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			return fmt.Errorf("sliding_ratelimit: redis: %w", err)
		}
	}
	return nil
}

// Cleanup releases this handler's use of its stores.
func (h *Handler) Cleanup() error {
	unregister(h)
	var errs []error
	for _, k := range []*string{&h.poolKey, &h.localKey} {
		if *k != "" {
			if _, err := stores.Delete(*k); err != nil {
				errs = append(errs, err)
			}
			*k = ""
		}
	}
	return errors.Join(errs...)
}

// The values of the enumerated subdirectives.
var (
	failModes   = []string{"open", "closed", "local"}
	clocks      = []string{"redis", "app"}
	headerModes = []string{"both", "ietf", "legacy", "off"}
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

// checkAmounts checks limit, global_limit and cost together.
func (h *Handler) checkAmounts() error {
	if h.Limit == "" {
		return errors.New("sliding_ratelimit: limit is required")
	}
	for _, a := range []struct {
		what string
		v    Amount
	}{{"limit", h.Limit}, {"global_limit", h.GlobalLimit}, {"cost", h.Cost}} {
		if err := a.v.checkStatic(a.what); err != nil {
			return fmt.Errorf("sliding_ratelimit: %w", err)
		}
	}
	if h.GlobalLimit != "" && h.Region == "" {
		return errors.New("sliding_ratelimit: global_limit needs region (it is the ceiling across regions)")
	}
	c := compileAmount(h.Cost, 1)
	for _, lim := range []struct {
		what string
		v    Amount
	}{{"limit", h.Limit}, {"global_limit", h.GlobalLimit}} {
		if lim.v == "" || lim.v.isDynamic() || c.tmpl != "" {
			continue
		}
		if l := compileAmount(lim.v, 0).static; c.static > l {
			return fmt.Errorf("sliding_ratelimit: cost %d is above %s %d: no request could ever pass", c.static, lim.what, l)
		}
	}
	return nil
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

func (h *Handler) checkEnums() error {
	for _, name := range []string{"fail", "clock", "headers", "on_limit"} {
		field, allowed := h.enum(name)
		if *field == "" {
			continue
		}
		if err := oneOf(name, *field, allowed...); err != nil {
			return fmt.Errorf("sliding_ratelimit: %w", err)
		}
	}
	if h.WarnAt > 1 {
		return fmt.Errorf("sliding_ratelimit: warn_at must be a share of the limit, at most 1, got %g", h.WarnAt)
	}
	if h.Burst < 0 {
		return fmt.Errorf("sliding_ratelimit: burst must be positive, got %d", h.Burst)
	}
	if h.DenyCacheSize < -1 {
		return fmt.Errorf("sliding_ratelimit: deny_cache_size must be -1 (off), 0 (default) or a size, got %d", h.DenyCacheSize)
	}
	return nil
}

// validate checks a Redis configuration without connecting.
func (c *RedisConfig) validate() error {
	if c.URL != "" && len(c.Addresses) > 0 {
		return errors.New("give either a URL or addresses, not both")
	}
	if c.URL == "" && len(c.Addresses) == 0 {
		return errors.New("needs a URL or an address")
	}
	if c.URL != "" {
		if _, err := redis.ParseURL(c.URL); err != nil {
			return fmt.Errorf("bad URL '%s': %w", c.URL, err)
		}
	}
	if c.Sentinel != "" && c.URL != "" {
		return errors.New("sentinel needs the Sentinels' addresses, not a URL")
	}
	if (len(c.Addresses) > 1 || c.Cluster) && c.Sentinel == "" && c.DB != 0 {
		return errors.New("a Redis Cluster has only db 0")
	}
	for _, a := range c.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("bad address '%s': want host:port", a)
		}
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return fmt.Errorf("key_prefix '%s' must not contain '{' or '}'", c.KeyPrefix)
	}
	if c.DB < 0 || c.PoolSize < 0 || c.Timeout < 0 || c.DialTimeout < 0 {
		return errors.New("db, pool_size and timeouts must not be negative")
	}
	if c.Pipeline < -1 || c.Pipeline > 64 {
		return fmt.Errorf("pipeline must be off (-1), 0 (default) or 1 to 64, got %d", c.Pipeline)
	}
	return nil
}

// options turns the configuration into go-redis options with short,
// bounded timeouts and no retries: a dead Redis must cost at most Timeout.
func (c *RedisConfig) options() (*redis.UniversalOptions, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{
		Addrs:            c.Addresses,
		Username:         c.Username,
		Password:         c.Password,
		DB:               c.DB,
		MasterName:       c.Sentinel,
		IsClusterMode:    c.Cluster && c.Sentinel == "",
		SentinelPassword: c.SentinelPassword,
	}
	if c.TLS != nil {
		tc, err := c.TLS.tlsConfig()
		if err != nil {
			return nil, err
		}
		o.TLSConfig = tc
	}
	if c.URL != "" {
		u, err := redis.ParseURL(c.URL)
		if err != nil {
			return nil, err
		}
		o.Addrs = []string{u.Addr}
		if o.TLSConfig == nil {
			o.TLSConfig = u.TLSConfig
		}
		if o.Username == "" {
			o.Username = u.Username
		}
		if o.Password == "" {
			o.Password = u.Password
		}
		if o.DB == 0 {
			o.DB = u.DB
		}
	}
	timeout := DefaultTimeout
	if c.Timeout > 0 {
		timeout = time.Duration(c.Timeout)
	}
	dial := DefaultDialTimeout
	if c.DialTimeout > 0 {
		dial = time.Duration(c.DialTimeout)
	}
	o.DialTimeout = dial
	o.DialerRetries = 1 // one dial attempt per call: the timeout bounds an outage, not a backoff loop
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1 // no retries: the fail mode decides, not a retry loop
	o.PoolSize = c.PoolSize
	o.DisableIdentity = true // no CLIENT SETINFO: one round trip less, and ACL users need no CLIENT
	o.Protocol = 2
	return o, nil
}

// DefaultPipelines is the default number of concurrent batch pipelines.
const DefaultPipelines = 2

// maxBatch bounds the checks sent in one pipeline.
const maxBatch = 64

// pipelines returns the number of batch pipelines, 0 for none.
func (c *RedisConfig) pipelines() int {
	switch {
	case c.Pipeline < 0:
		return 0
	case c.Pipeline == 0:
		return DefaultPipelines
	}
	return c.Pipeline
}

// poolKey identifies a Redis configuration: handlers with the same one share
// a client and its connection pool, across config reloads too.
func (c *RedisConfig) poolKey() string {
	cp := *c
	cp.KeyPrefix = ""
	b, _ := json.Marshal(cp)
	return "redis:" + string(b)
}

// burstLogger logs an error at most once per period, counting the rest.
type burstLogger struct {
	every      time.Duration
	last       atomic.Int64 // unix ns of the last line
	suppressed atomic.Int64
}

// allow reports whether a line may be written now, and how many were
// suppressed since the last one.
func (b *burstLogger) allow(now time.Time) (bool, int64) {
	last := b.last.Load()
	if now.UnixNano()-last < int64(b.every) || !b.last.CompareAndSwap(last, now.UnixNano()) {
		b.suppressed.Add(1)
		return false, 0
	}
	return true, b.suppressed.Swap(0)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
