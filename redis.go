package slidingratelimit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// RedisConfig is the Redis the limiter keeps its state in.
type RedisConfig struct {
	// URL is a redis:// or rediss:// URL (user, password, host, port and
	// db). Either URL or Addresses. {env.*} placeholders are replaced.
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

	// Password authenticates the connection. {env.REDIS_PASSWORD} reads an
	// environment variable when the config loads (empty: no password), as
	// {$REDIS_PASSWORD} does when a Caddyfile is adapted.
	Password string `json:"password,omitempty"`

	// DB is the database number (not on a cluster). Default 0.
	DB int `json:"db,omitempty"`

	// TLS, when present, connects with TLS (rediss:// URLs do too).
	TLS *RedisTLS `json:"tls,omitempty"`

	// DialTimeout bounds connecting to Redis. Default 250ms.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// Timeout bounds one decision: the whole call to Redis, including
	// waiting for a pooled connection and for the batch in flight. When it
	// passes, the fail mode applies, and Redis will not run the check if it
	// reaches it later. Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// PoolSize is the maximum number of connections. Default: go-redis's
	// default of 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Pipeline is the number of concurrent pipelines that carry the checks
	// of concurrent requests to Redis in batches (a batch is one script
	// call per hash slot, each check still atomic): far fewer round trips,
	// system calls and script calls under load, at the cost of waiting for
	// the batch in flight. -1 sends every check on its own. Default 2.
	Pipeline int `json:"pipeline,omitempty"`

	// KeyPrefix starts every key the limiter writes (and names the channel
	// resets are announced on). It must not contain '{' or '}'.
	// Default "ratelimit:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Scripts is how the script is called: "functions" (the default) loads
	// it once as a function library where Redis has functions (7 and
	// later, Valkey) and calls it with FCALL, and uses EVALSHA elsewhere;
	// "eval" always uses EVALSHA.
	Scripts string `json:"scripts,omitempty"`

	// StateFormat is the format sliding_log keys are written in: 2 (the
	// default) or 1, the format of releases before the state format
	// version, while nodes of such a release share the Redis (a rolling
	// upgrade from one, a rollback to one). Every key of either format is
	// read, and turned into this one as it is written. docs/redis.md,
	// "Upgrading".
	StateFormat int `json:"state_format,omitempty"`
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

// DefaultPipelines is the default number of concurrent batch pipelines.
const DefaultPipelines = 2

// maxBatch bounds the checks sent in one pipeline.
const maxBatch = 64

// provision replaces {env.*} placeholders in the secrets and the URL.
func (c *RedisConfig) provision() {
	repl := caddy.NewReplacer()
	for _, f := range []*string{&c.URL, &c.Username, &c.Password, &c.SentinelPassword} {
		*f = repl.ReplaceAll(*f, "")
	}
}

// validate checks a Redis configuration without connecting. Its errors
// name the subdirective at fault (redis.<sub>).
func (c *RedisConfig) validate() error { return c.check("redis") }

// check is validate for the block of directive dir (redis or
// global_redis): its errors name dir.<sub>.
func (c *RedisConfig) check(dir string) error {
	redisErr := func(sub, format string, args ...any) error { return dirErr(dir, sub, format, args...) }
	if c.URL != "" && len(c.Addresses) > 0 {
		return redisErr("address", "give either a URL or addresses, not both")
	}
	if c.URL == "" && len(c.Addresses) == 0 {
		return redisErr("", "needs a URL or an address")
	}
	if c.URL != "" && !strings.Contains(c.URL, "{") {
		if scheme, _, ok := strings.Cut(c.URL, "://"); ok && scheme != "redis" && scheme != "rediss" {
			return redisErr("url", "bad URL '%s': the scheme must be redis:// or rediss:// (TLS), not %s://", c.URL, scheme)
		} else if !ok {
			return redisErr("url", "bad URL '%s': it needs a scheme: write redis://%s (or rediss:// for TLS)", c.URL, strings.TrimPrefix(c.URL, "//"))
		}
		if _, err := redis.ParseURL(c.URL); err != nil {
			return redisErr("url", "bad URL '%s': %v", c.URL, err)
		}
	}
	if c.Sentinel != "" && c.URL != "" {
		return redisErr("sentinel", "sentinel needs the Sentinels' addresses, not a URL")
	}
	if c.SentinelPassword != "" && c.Sentinel == "" {
		return redisErr("sentinel_password", "sentinel_password applies to sentinel, and this redis has none")
	}
	if c.Cluster && c.Sentinel != "" {
		return redisErr("cluster", "cluster and sentinel exclude each other: the addresses are either cluster nodes or Sentinels")
	}
	if (len(c.Addresses) > 1 || c.Cluster) && c.Sentinel == "" && c.DB != 0 {
		return redisErr("db", "a Redis Cluster has only db 0")
	}
	for _, a := range c.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return redisErr("address", "bad address '%s': want host:port", a)
		}
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return redisErr("key_prefix", "key_prefix '%s' must not contain '{' or '}'", c.KeyPrefix)
	}
	if c.DB < 0 || c.PoolSize < 0 || c.Timeout < 0 || c.DialTimeout < 0 {
		return redisErr("", "db, pool_size and timeouts must not be negative")
	}
	if c.Scripts != "" && c.Scripts != "functions" && c.Scripts != "eval" {
		return redisErr("scripts", "scripts must be functions or eval, got '%s'", c.Scripts)
	}
	if c.StateFormat != 0 && c.StateFormat != limiter.LogFormat1 && c.StateFormat != limiter.LogFormat2 {
		return redisErr("state_format", "state_format must be 1 or 2, got %d", c.StateFormat)
	}
	if c.Pipeline < -1 || c.Pipeline > 64 {
		return redisErr("pipeline", "pipeline must be off (-1), 0 (default) or 1 to 64, got %d", c.Pipeline)
	}
	if c.TLS != nil && (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return redisErr("tls", "tls: cert and key go together")
	}
	return nil
}

// dirErr is a configuration error of the subdirective sub of the block of
// dir (redis or global_redis).
func dirErr(dir, sub, format string, args ...any) error {
	field := dir
	if sub != "" {
		field += "." + sub
	}
	return &configError{field: field, err: fmt.Errorf(dir+": "+format, args...)}
}

// DefaultLedgerTimeout bounds one call of the ledger (global_redis) when
// its block gives no timeout.
const DefaultLedgerTimeout = time.Second

// checkLedger checks a global_redis block: a redis block's checks (naming
// global_redis.<sub>), and what a ledger cannot be or does not use.
func (c *RedisConfig) checkLedger() error {
	const dir = "global_redis"
	if err := c.check(dir); err != nil {
		return err
	}
	switch {
	case c.KeyPrefix != "":
		return dirErr(dir, "key_prefix", "key_prefix does not apply to the ledger: its keys take the limiter's namespace (redis key_prefix and name), which must be the same in every data centre")
	case c.Pipeline != 0:
		return dirErr(dir, "pipeline", "pipeline does not apply to the ledger: it is called in the background, one call per renewal, not per request")
	case c.Scripts != "":
		return dirErr(dir, "scripts", "scripts does not apply to the ledger: it always uses EVALSHA")
	case c.StateFormat != 0:
		return dirErr(dir, "state_format", "state_format does not apply to the ledger: it holds no sliding_log key")
	}
	return nil
}

// ledgerTimeout bounds one call of the ledger.
func (c *RedisConfig) ledgerTimeout() time.Duration {
	if c.Timeout > 0 {
		return time.Duration(c.Timeout)
	}
	return DefaultLedgerTimeout
}

// timeout is the bound on one decision.
func (c *RedisConfig) timeout() time.Duration {
	if c.Timeout > 0 {
		return time.Duration(c.Timeout)
	}
	return DefaultTimeout
}

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
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls cert/key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// options turns the configuration into go-redis options with short,
// bounded timeouts and no retries: a dead Redis must cost at most Timeout.
func (c *RedisConfig) options() (*redis.UniversalOptions, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c.clientOptions(c.timeout())
}

// clientOptions are the go-redis options of a configuration already
// checked, timeout bounding each call.
func (c *RedisConfig) clientOptions(timeout time.Duration) (*redis.UniversalOptions, error) {
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
	// No CLIENT MAINT_NOTIFICATIONS on each new connection: one round trip
	// less (across data centres, for the ledger, it counts).
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.Protocol = 2
	return o, nil
}

// poolKey identifies a Redis configuration: handlers with the same one share
// a client and its connection pool, across config reloads too.
func (c *RedisConfig) poolKey() string {
	cp := *c
	cp.KeyPrefix = ""
	b, _ := json.Marshal(cp)
	return "redis:" + string(b)
}

// target names a Redis config in logs, without credentials.
func (c *RedisConfig) target() string {
	if c.URL != "" {
		if o, err := redis.ParseURL(c.URL); err == nil {
			return o.Addr
		}
	}
	t := strings.Join(c.Addresses, ",")
	if c.Sentinel != "" {
		t = c.Sentinel + "@" + t
	}
	return t
}

// stores shares stores between handlers and across config reloads: a reload
// provisions the new handlers (taking a reference) before it cleans up the
// old ones, so an unchanged store, its state and its connection pool live on.
var stores = caddy.NewUsagePool()

const memoryPoolKey = "memory"

// memoryEntry is the process's one in-process store. Keys carry the limiter
// name, so limiters never see each other's state.
type memoryEntry struct{ *limiter.MemoryStore }

func (m memoryEntry) Destruct() error { return m.Close() }

// redisEntry is one Redis client and its store, behind a circuit breaker,
// per distinct Redis config.
type redisEntry struct {
	client redis.UniversalClient
	store  *limiter.RedisStore
	*limiter.Breaker
	ping *pingResult // at creation; a refusal is a configuration error (checkAccess)
}

func (r redisEntry) Destruct() error {
	r.store.Close()
	return r.client.Close()
}

func acquireMemoryStore() (*limiter.MemoryStore, string, error) {
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return memoryEntry{limiter.NewMemoryStore()}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(memoryEntry).MemoryStore, memoryPoolKey, nil
}

// acquireRedisStore returns the store of cfg, creating its client on first
// use. It does not wait for Redis: a Redis that is down at start does not
// stop Caddy (a warning is logged once), the fail mode covers it until
// Redis answers; one that answers and refuses is checkAccess's.
func acquireRedisStore(cfg *RedisConfig, log *zap.Logger) (redisEntry, string, error) {
	key := cfg.poolKey()
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		opts, err := cfg.options()
		if err != nil {
			return nil, err
		}
		client := redis.NewUniversalClient(opts)
		var ropts []limiter.RedisOption
		if w := cfg.pipelines(); w > 0 {
			ropts = append(ropts, limiter.WithBatching(w, maxBatch))
		}
		if cfg.Scripts == "eval" {
			ropts = append(ropts, limiter.WithScripts(limiter.ScriptsEval))
		}
		if cfg.StateFormat != 0 {
			ropts = append(ropts, limiter.WithStateFormat(cfg.StateFormat))
		}
		store := limiter.NewRedisStore(client, ropts...)
		target := cfg.target()
		breaker := limiter.NewBreaker(store, limiter.BreakerConfig{
			OnChange:  logBreakerChange(log, target),
			IsFailure: limiter.IsUnavailable,
		})
		ping := startPing(client, opts.DialTimeout+cfg.timeout(), func(err error) {
			log.Warn("redis does not answer at start; requests follow the fail mode until it does",
				zap.String("redis", target), zap.Error(err))
		})
		return redisEntry{client: client, store: store, Breaker: breaker, ping: ping}, nil
	})
	if err != nil {
		return redisEntry{}, "", err
	}
	return v.(redisEntry), key, nil
}

// ledgerEntry is one client of a ledger (global_redis) and its Ledger, per
// distinct global_redis config: every limiter of the process with that
// config shares them, across reloads too.
type ledgerEntry struct {
	client redis.UniversalClient
	ledger *limiter.Ledger
	ping   *pingResult
}

func (e ledgerEntry) Destruct() error { return e.client.Close() }

// acquireLedger returns the ledger of cfg (a checked global_redis block),
// creating its client on first use. Like acquireRedisStore it does not
// wait for the ledger: one that is down at start is warned about once, and
// the fail mode covers it.
func acquireLedger(cfg *RedisConfig, log *zap.Logger) (ledgerEntry, string, error) {
	key := "ledger:" + strings.TrimPrefix(cfg.poolKey(), "redis:")
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		if err := cfg.checkLedger(); err != nil {
			return nil, err
		}
		opts, err := cfg.clientOptions(cfg.ledgerTimeout())
		if err != nil {
			return nil, err
		}
		if cfg.DialTimeout == 0 {
			// A ledger may be 250 ms away, and TLS takes round trips.
			opts.DialTimeout = cfg.ledgerTimeout()
		}
		client := redis.NewUniversalClient(opts)
		target := cfg.target()
		ping := startPing(client, opts.DialTimeout+cfg.ledgerTimeout(), func(err error) {
			log.Warn("the ledger (global_redis) does not answer at start; identities that need a share follow the fail mode until it does",
				zap.String("global_redis", target), zap.Error(err))
		})
		return ledgerEntry{client: client, ledger: limiter.NewLedger(client), ping: ping}, nil
	})
	if err != nil {
		return ledgerEntry{}, "", err
	}
	return v.(ledgerEntry), key, nil
}

// logBreakerChange logs each circuit state change once: opening at error
// level, recovery at info, probes at debug.
func logBreakerChange(log *zap.Logger, target string) func(from, to limiter.BreakerState, cause error) {
	return func(from, to limiter.BreakerState, cause error) {
		fields := []zap.Field{zap.String("redis", target), zap.String("from", from.String()), zap.String("to", to.String())}
		switch to {
		case limiter.Open:
			if from == limiter.Closed {
				log.Error("redis circuit opened: requests follow the fail mode without calling redis until a probe succeeds",
					append(fields, zap.Error(cause))...)
			} else {
				log.Debug("redis probe failed; circuit open again", append(fields, zap.Error(cause))...)
			}
		case limiter.Closed:
			log.Info("redis circuit closed: redis answers again", fields...)
		default:
			log.Debug("redis circuit half open: probing", fields...)
		}
	}
}

// releaseAfterDone gives back the handler's stores once its last request
// in flight is done: a reload cleans up the old config's handlers while
// their requests still run, and a request's lease must be released, and its
// count_only units recorded, by the client that holds them (a redis block
// that changed makes a new client and closes the old one when its last
// handler lets go). Nothing in flight: at once.
func (h *Handler) releaseAfterDone() error {
	keys := []string{h.rt.storeKey, h.rt.localKey, h.rt.ledgerKey}
	h.rt.storeKey, h.rt.localKey, h.rt.ledgerKey = "", "", ""
	var err error
	log := h.rt.logger
	h.rt.lim.AfterDone(func(deferred bool) {
		e := releaseStores(keys)
		if !deferred {
			err = e
		} else if e != nil {
			log.Error("releasing the stores of a config that ended", zap.Error(e))
		}
	})
	return err
}

// releaseStores gives back the stores of keys (empty ones skipped).
func releaseStores(keys []string) error {
	var errs []error
	for _, k := range keys {
		if k != "" {
			if _, err := stores.Delete(k); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// backend opens (or shares) the handler's store stack, and the ledger of
// global_redis.
func (h *Handler) backend() (limiter.Backend, error) {
	b, err := h.storeBackend()
	if err != nil || h.GlobalRedis == nil {
		return b, err
	}
	e, key, err := acquireLedger(h.GlobalRedis, h.rt.logger)
	if err != nil {
		h.release()
		var ce *configError
		if errors.As(err, &ce) {
			return limiter.Backend{}, h.named(err)
		}
		return limiter.Backend{}, fmt.Errorf("sliding_ratelimit: limiter %s: global_redis %w", h.Name, err)
	}
	h.rt.ledgerKey, h.rt.ledger = key, e.ledger
	h.rt.ledgerClient, h.rt.ledgerPing = e.client, e.ping
	b.Global = &limiter.Global{Ledger: e.ledger, Datacenter: h.Datacenter, Timeout: h.GlobalRedis.ledgerTimeout(),
		OnEvent: h.rt.metrics.globalEvent}
	return b, nil
}

// storeBackend opens (or shares) the handler's store stack.
func (h *Handler) storeBackend() (limiter.Backend, error) {
	if h.Redis == nil {
		mem, key, err := acquireMemoryStore()
		if err != nil {
			return limiter.Backend{}, err
		}
		h.rt.storeKey, h.rt.memory = key, mem
		return limiter.Backend{Store: mem, Source: limiter.SourceMemory, Notifier: mem}, nil
	}
	e, key, err := acquireRedisStore(h.Redis, h.rt.logger)
	if err != nil {
		// Found when the config loads, not when a Caddyfile is adapted
		// (the files may not be on the machine that adapts it): name the
		// limiter, as no line can be.
		var ce *configError
		if errors.As(err, &ce) {
			return limiter.Backend{}, h.named(err)
		}
		return limiter.Backend{}, fmt.Errorf("sliding_ratelimit: limiter %s: redis %w", h.Name, err)
	}
	h.rt.storeKey, h.rt.breaker = key, e.Breaker
	h.rt.redis, h.rt.redisPing = e.client, e.ping
	b := limiter.Backend{
		Store: e.Breaker, Base: e.store, Source: limiter.SourceRedis, Remote: true,
		DenyCacheSize: h.DenyCacheSize, Notifier: e.store,
	}
	if h.Fail == "local" {
		mem, lkey, err := acquireMemoryStore()
		if err != nil {
			h.release()
			return limiter.Backend{}, err
		}
		h.rt.localKey, h.rt.memory, b.Local = lkey, mem, mem
	}
	return b, nil
}
