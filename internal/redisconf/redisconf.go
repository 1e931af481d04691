// Package redisconf turns a Redis configuration (one server, a Cluster, a
// Sentinel group; TLS; an ACL user) into go-redis client options and the
// engine's Redis store options, and checks it without connecting. It
// imports nothing of Caddy: the Caddy handler's redis block and the
// net/http middleware (httplimit) both build their clients with it.
package redisconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Defaults.
const (
	// DefaultTimeout bounds one decision.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultDialTimeout bounds connecting.
	DefaultDialTimeout = 250 * time.Millisecond
	// DefaultLedgerTimeout bounds one call of the ledger (global_redis).
	DefaultLedgerTimeout = time.Second
	// DefaultPipelines is the default number of concurrent batch pipelines.
	DefaultPipelines = 2
	// MaxBatch bounds the checks sent in one pipeline.
	MaxBatch = 64
)

// Config is a Redis the limiter keeps its state in (or the ledger of the
// global ceiling across data centres). The fields mean what the Caddyfile's
// redis subdirectives of the same names mean (docs/reference.md).
type Config struct {
	// URL is a redis:// or rediss:// URL (user, password, host, port and
	// db). Either URL or Addresses.
	URL string
	// Addresses lists host:port of the Redis server. Several addresses make
	// a Redis Cluster client; with Sentinel, they are the Sentinels.
	Addresses []string
	// Cluster makes a Redis Cluster client even with one address.
	Cluster bool
	// Sentinel is the master name monitored by the Sentinels at Addresses.
	Sentinel string
	// SentinelPassword authenticates to the Sentinels.
	SentinelPassword string
	// Username is the ACL user, Password its password.
	Username, Password string
	// DB is the database number (not on a cluster).
	DB int
	// TLS, when set, connects with TLS (rediss:// URLs do too).
	TLS *TLS
	// DialTimeout bounds connecting. Default 250ms.
	DialTimeout time.Duration
	// Timeout bounds one decision (Redis call, pool wait and batch);
	// when it passes, the fail mode applies. Default 100ms (1s for a
	// ledger).
	Timeout time.Duration
	// PoolSize is the maximum number of connections (0: go-redis's
	// default).
	PoolSize int
	// Pipeline is the number of batch pipelines: -1 none, 0 the default
	// (2), 1 to 64.
	Pipeline int
	// KeyPrefix starts every key (no '{' or '}'). Default "ratelimit:".
	KeyPrefix string
	// Scripts is "functions" (the default) or "eval".
	Scripts string
	// StateFormat is the state format sliding_log and sliding_counter keys
	// are written in: 0 (the default, each one's newest), 1, 2, 3 or 4 (for
	// each algorithm its newest format up to this one).
	StateFormat int
}

// TLS configures TLS to Redis. An empty one uses the system roots.
type TLS struct {
	// CA is a PEM file of the certificate authorities to trust.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName overrides the name checked in the server's certificate.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// Error is a configuration error: Sub names the subdirective at fault
// ("" for the block), Msg says what is wrong.
type Error struct {
	Sub, Msg string
}

func (e *Error) Error() string { return e.Msg }

func errf(sub, format string, args ...any) *Error {
	return &Error{Sub: sub, Msg: fmt.Sprintf(format, args...)}
}

// Check checks the configuration without connecting.
func (c *Config) Check() *Error {
	if c.URL != "" && len(c.Addresses) > 0 {
		return errf("address", "give either a URL or addresses, not both")
	}
	if c.URL == "" && len(c.Addresses) == 0 {
		return errf("", "needs a URL or an address")
	}
	if c.URL != "" && !strings.Contains(c.URL, "{") {
		if scheme, _, ok := strings.Cut(c.URL, "://"); ok && scheme != "redis" && scheme != "rediss" {
			return errf("url", "bad URL '%s': the scheme must be redis:// or rediss:// (TLS), not %s://", c.URL, scheme)
		} else if !ok {
			return errf("url", "bad URL '%s': it needs a scheme: write redis://%s (or rediss:// for TLS)", c.URL, strings.TrimPrefix(c.URL, "//"))
		}
		if _, err := redis.ParseURL(c.URL); err != nil {
			return errf("url", "bad URL '%s': %v", c.URL, err)
		}
	}
	if c.Sentinel != "" && c.URL != "" {
		return errf("sentinel", "sentinel needs the Sentinels' addresses, not a URL")
	}
	if c.SentinelPassword != "" && c.Sentinel == "" {
		return errf("sentinel_password", "sentinel_password applies to sentinel, and this redis has none")
	}
	if c.Cluster && c.Sentinel != "" {
		return errf("cluster", "cluster and sentinel exclude each other: the addresses are either cluster nodes or Sentinels")
	}
	if (len(c.Addresses) > 1 || c.Cluster) && c.Sentinel == "" && c.DB != 0 {
		return errf("db", "a Redis Cluster has only db 0")
	}
	for _, a := range c.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return errf("address", "bad address '%s': want host:port", a)
		}
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return errf("key_prefix", "key_prefix '%s' must not contain '{' or '}'", c.KeyPrefix)
	}
	if c.DB < 0 || c.PoolSize < 0 || c.Timeout < 0 || c.DialTimeout < 0 {
		return errf("", "db, pool_size and timeouts must not be negative")
	}
	if c.Scripts != "" && c.Scripts != "functions" && c.Scripts != "eval" {
		return errf("scripts", "scripts must be functions or eval, got '%s'", c.Scripts)
	}
	if c.StateFormat != 0 && c.StateFormat != limiter.LogFormat1 && c.StateFormat != limiter.LogFormat2 &&
		c.StateFormat != limiter.CounterFormat3 && c.StateFormat != limiter.CounterFormat4 {
		return errf("state_format", "state_format must be 1, 2, 3 or 4, got %d", c.StateFormat)
	}
	if c.Pipeline < -1 || c.Pipeline > 64 {
		return errf("pipeline", "pipeline must be off (-1), 0 (default) or 1 to 64, got %d", c.Pipeline)
	}
	if c.TLS != nil && (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return errf("tls", "tls: cert and key go together")
	}
	return nil
}

// CheckLedger checks the configuration of a ledger (global_redis): Check,
// and what a ledger cannot be or does not use.
func (c *Config) CheckLedger() *Error {
	if err := c.Check(); err != nil {
		return err
	}
	switch {
	case c.KeyPrefix != "":
		return errf("key_prefix", "key_prefix does not apply to the ledger: its keys take the limiter's namespace (redis key_prefix and name), which must be the same in every data centre")
	case c.Pipeline != 0:
		return errf("pipeline", "pipeline does not apply to the ledger: it is called in the background, one call per renewal, not per request")
	case c.Scripts != "":
		return errf("scripts", "scripts does not apply to the ledger: it always uses EVALSHA")
	case c.StateFormat != 0:
		return errf("state_format", "state_format does not apply to the ledger: it holds no sliding_log key")
	}
	return nil
}

// DecisionTimeout is the bound on one decision.
func (c *Config) DecisionTimeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// LedgerTimeout bounds one call of the ledger.
func (c *Config) LedgerTimeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultLedgerTimeout
}

// Pipelines returns the number of batch pipelines, 0 for none.
func (c *Config) Pipelines() int {
	switch {
	case c.Pipeline < 0:
		return 0
	case c.Pipeline == 0:
		return DefaultPipelines
	}
	return c.Pipeline
}

// Target names the Redis in logs, without credentials.
func (c *Config) Target() string {
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

// Config loads the files into a *tls.Config.
func (t *TLS) Config() (*tls.Config, error) {
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

// ClientOptions are the go-redis options of a configuration already
// checked, timeout bounding each call: short, bounded timeouts and no
// retries, so that a dead Redis costs at most the timeout.
func (c *Config) ClientOptions(timeout time.Duration) (*redis.UniversalOptions, error) {
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
		tc, err := c.TLS.Config()
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
		dial = c.DialTimeout
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

// LedgerOptions are the go-redis options of a ledger (global_redis)
// already checked: each call bounded by LedgerTimeout, and, without a
// dial_timeout, dialling too (a ledger may be 250 ms away, and TLS takes
// round trips).
func (c *Config) LedgerOptions() (*redis.UniversalOptions, error) {
	opts, err := c.ClientOptions(c.LedgerTimeout())
	if err != nil {
		return nil, err
	}
	if c.DialTimeout == 0 {
		opts.DialTimeout = c.LedgerTimeout()
	}
	return opts, nil
}

// StoreOptions are the engine's Redis store options of the configuration:
// batching, the way scripts are called, the state format.
func (c *Config) StoreOptions() []limiter.RedisOption {
	var ropts []limiter.RedisOption
	if w := c.Pipelines(); w > 0 {
		ropts = append(ropts, limiter.WithBatching(w, MaxBatch))
	}
	if c.Scripts == "eval" {
		ropts = append(ropts, limiter.WithScripts(limiter.ScriptsEval))
	}
	if c.StateFormat != 0 {
		ropts = append(ropts, limiter.WithStateFormat(c.StateFormat))
	}
	return ropts
}

// Store is a Redis client and the engine's store on it, behind a circuit
// breaker.
type Store struct {
	Client  redis.UniversalClient
	Options *redis.UniversalOptions
	Store   *limiter.RedisStore
	Breaker *limiter.Breaker
}

// OpenStore makes the client and the store of a checked configuration,
// without waiting for Redis; onChange, when set, hears of each circuit
// state change.
func (c *Config) OpenStore(onChange func(from, to limiter.BreakerState, cause error)) (*Store, error) {
	opts, err := c.ClientOptions(c.DecisionTimeout())
	if err != nil {
		return nil, err
	}
	client := redis.NewUniversalClient(opts)
	store := limiter.NewRedisStore(client, c.StoreOptions()...)
	breaker := limiter.NewBreaker(store, limiter.BreakerConfig{OnChange: onChange, IsFailure: limiter.IsUnavailable})
	return &Store{Client: client, Options: opts, Store: store, Breaker: breaker}, nil
}

// Close closes the store and its client.
func (s *Store) Close() error {
	s.Store.Close()
	return s.Client.Close()
}

// OpenLedger makes the client and the ledger of a checked ledger
// configuration (global_redis), without waiting for it.
func (c *Config) OpenLedger() (redis.UniversalClient, *redis.UniversalOptions, *limiter.Ledger, error) {
	opts, err := c.LedgerOptions()
	if err != nil {
		return nil, nil, nil, err
	}
	client := redis.NewUniversalClient(opts)
	return client, opts, limiter.NewLedger(client), nil
}
