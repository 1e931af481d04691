package slidingratelimit

import (
	"context"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// stores shares stores between handlers and across config reloads: a reload
// provisions the new handlers (taking a reference) before it cleans up the
// old ones, so an unchanged store, its state and its connection pool live on.
var stores = caddy.NewUsagePool()

const memoryPoolKey = "memory"

// memoryEntry is the process's one in-process store. Keys carry the limiter
// name and algorithm, so limiters never see each other's state.
type memoryEntry struct{ *limiter.MemoryStore }

func (m memoryEntry) Destruct() error { return m.Close() }

// redisEntry is one Redis client and its store, behind a circuit breaker,
// per distinct Redis config.
type redisEntry struct {
	client redis.UniversalClient
	store  *limiter.RedisStore
	*limiter.Breaker
}

func (r redisEntry) Destruct() error {
	r.store.Close()
	return r.client.Close()
}

func acquireMemoryStore() (limiter.Store, string, error) {
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return memoryEntry{limiter.NewMemoryStore()}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(memoryEntry).MemoryStore, memoryPoolKey, nil
}

// acquireRedisStore returns the store of cfg, creating its client on first
// use. It does not connect: a Redis that is down at start does not stop
// Caddy, the fail mode covers it until Redis answers.
func acquireRedisStore(cfg *RedisConfig) (*limiter.Breaker, string, error) {
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
		store := limiter.NewRedisStore(client, ropts...)
		breaker := limiter.NewBreaker(store, limiter.BreakerConfig{
			OnChange:  logBreakerChange(redisTarget(cfg)),
			IsFailure: limiter.IsUnavailable,
		})
		return redisEntry{client: client, store: store, Breaker: breaker}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(redisEntry).Breaker, key, nil
}

func init() {
	// go-redis logs dial failures through the standard logger, once per
	// failed dial: during an outage that is a line per request. The handler
	// logs store errors itself, once per burst; go-redis's own lines go to
	// Caddy's log at debug level.
	redis.SetLogger(redisLogger{})
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if c := caddy.Log().Named("sliding_ratelimit.redis").Check(zapcore.DebugLevel, "go-redis"); c != nil {
		c.Write(zap.String("message", fmt.Sprintf(format, v...)))
	}
}

// logBreakerChange logs each circuit state change once: opening at error
// level, recovery at info, probes at debug.
func logBreakerChange(target string) func(from, to limiter.BreakerState, cause error) {
	return func(from, to limiter.BreakerState, cause error) {
		log := caddy.Log().Named("http.handlers.sliding_ratelimit")
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

// redisTarget names a Redis config in logs, without credentials.
func redisTarget(cfg *RedisConfig) string {
	if cfg.URL != "" {
		if o, err := redis.ParseURL(cfg.URL); err == nil {
			return o.Addr
		}
	}
	t := strings.Join(cfg.Addresses, ",")
	if cfg.Sentinel != "" {
		t = cfg.Sentinel + "@" + t
	}
	return t
}
