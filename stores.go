package slidingratelimit

import (
	"context"
	"fmt"

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

// redisEntry is one Redis client and its store, per distinct Redis config.
type redisEntry struct {
	client redis.UniversalClient
	*limiter.RedisStore
}

func (r redisEntry) Destruct() error { return r.client.Close() }

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
func acquireRedisStore(cfg *RedisConfig) (limiter.Store, string, error) {
	key := cfg.poolKey()
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		opts, err := cfg.options()
		if err != nil {
			return nil, err
		}
		client := redis.NewUniversalClient(opts)
		return redisEntry{client: client, RedisStore: limiter.NewRedisStore(client)}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(redisEntry).RedisStore, key, nil
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
