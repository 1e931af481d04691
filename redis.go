package slidingratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redisconf"
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

	// StateFormat is the format sliding_log and sliding_counter keys are
	// written in, for each algorithm its newest up to this number: 4 (the
	// default; the log's format 3, the counter's format 4), 3 (both
	// algorithms' format 3, while nodes of a build before format 4 share
	// the Redis), 2 (each one's format 2, while
	// nodes of a build writing it share the Redis) or 1, the format of
	// releases before the state format version, while nodes of such a
	// release share the Redis (a rolling upgrade from one, a rollback to
	// one). Every key of any of these formats is read, and turned into this
	// one as it is written. docs/redis.md,
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
const DefaultPipelines = redisconf.DefaultPipelines

// provision replaces {env.*} placeholders in the secrets and the URL.
func (c *RedisConfig) provision() {
	repl := caddy.NewReplacer()
	for _, f := range []*string{&c.URL, &c.Username, &c.Password, &c.SentinelPassword} {
		*f = repl.ReplaceAll(*f, "")
	}
}

// conf is the configuration as internal/redisconf takes it.
func (c *RedisConfig) conf() *redisconf.Config {
	rc := &redisconf.Config{
		URL: c.URL, Addresses: c.Addresses, Cluster: c.Cluster, Sentinel: c.Sentinel,
		SentinelPassword: c.SentinelPassword, Username: c.Username, Password: c.Password, DB: c.DB,
		DialTimeout: time.Duration(c.DialTimeout), Timeout: time.Duration(c.Timeout), PoolSize: c.PoolSize,
		Pipeline: c.Pipeline, KeyPrefix: c.KeyPrefix, Scripts: c.Scripts, StateFormat: c.StateFormat,
	}
	if c.TLS != nil {
		t := redisconf.TLS(*c.TLS)
		rc.TLS = &t
	}
	return rc
}

// validate checks a Redis configuration without connecting. Its errors
// name the subdirective at fault (redis.<sub>).
func (c *RedisConfig) validate() error { return c.check("redis") }

// check is validate for the block of directive dir (redis or
// global_redis): its errors name dir.<sub>.
func (c *RedisConfig) check(dir string) error { return dirErrOf(dir, c.conf().Check()) }

// dirErrOf is the configuration error of a check of the block of dir.
func dirErrOf(dir string, e *redisconf.Error) error {
	if e == nil {
		return nil
	}
	return dirErr(dir, e.Sub, "%s", e.Msg)
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
const DefaultLedgerTimeout = redisconf.DefaultLedgerTimeout

// checkLedger checks a global_redis block: a redis block's checks (naming
// global_redis.<sub>), and what a ledger cannot be or does not use.
func (c *RedisConfig) checkLedger() error { return dirErrOf("global_redis", c.conf().CheckLedger()) }

// ledgerTimeout bounds one call of the ledger.
func (c *RedisConfig) ledgerTimeout() time.Duration { return c.conf().LedgerTimeout() }

// timeout is the bound on one decision.
func (c *RedisConfig) timeout() time.Duration { return c.conf().DecisionTimeout() }

// options turns the configuration into go-redis options with short,
// bounded timeouts and no retries: a dead Redis must cost at most Timeout.
func (c *RedisConfig) options() (*redis.UniversalOptions, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c.conf().ClientOptions(c.timeout())
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
func (c *RedisConfig) target() string { return c.conf().Target() }

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
		if err := cfg.validate(); err != nil {
			return nil, err
		}
		rc := cfg.conf()
		target := rc.Target()
		st, err := rc.OpenStore(logBreakerChange(log, target))
		if err != nil {
			return nil, err
		}
		client, store, breaker := st.Client, st.Store, st.Breaker
		ping := startPing(client, st.Options.DialTimeout+rc.DecisionTimeout(), func(err error) {
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
		client, opts, ledger, err := cfg.conf().OpenLedger()
		if err != nil {
			return nil, err
		}
		target := cfg.target()
		ping := startPing(client, opts.DialTimeout+cfg.ledgerTimeout(), func(err error) {
			log.Warn("the ledger (global_redis) does not answer at start; identities that need a share follow the fail mode until it does",
				zap.String("global_redis", target), zap.Error(err))
		})
		return ledgerEntry{client: client, ledger: ledger, ping: ping}, nil
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
		OnEvent: h.rt.metrics.GlobalEvent}
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
