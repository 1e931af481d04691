package limiter_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestBatchedErrorRepliesAsGoRedisReadsThem: the batching store reads
// replies itself, and an error reply for a whole call still reaches go-redis
// as one it parsed: a READONLY reply (a primary demoted to replica) drops
// the connection, so the next call dials again and can find the promoted
// primary; an error about the call (a key of the wrong type) keeps it.
func TestBatchedErrorRepliesAsGoRedisReadsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := func(key string) *limiter.Op {
		return &limiter.Op{Cost: 1, Parts: []limiter.Part{{Key: key, Kind: limiter.KindLog,
			Windows: []limiter.Win{{Name: limiter.WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 5}}}}}
	}
	const calls = 4

	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	client := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1, Protocol: 2})
	t.Cleanup(func() { client.Close() })
	store := limiter.NewRedisStore(client, limiter.WithBatching(1, 8))
	t.Cleanup(func() { store.Close() })
	for i := range calls {
		_, err := store.Do(ctx, op("t:{readonly}"))
		if err == nil || !strings.HasPrefix(err.Error(), "READONLY") || !limiter.IsUnavailable(err) {
			t.Fatalf("call %d on a replica: %v, want READONLY, an outage", i, err)
		}
	}
	if dials := client.PoolStats().Misses; dials < calls {
		t.Errorf("%d calls answered READONLY dialled %d connections: the connection was kept", calls, dials)
	}

	client = redis.NewClient(&redis.Options{Addr: primary.Addr(), MaxRetries: -1, Protocol: 2})
	t.Cleanup(func() { client.Close() })
	if err := client.Set(ctx, "t:{wrongtype}", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	store = limiter.NewRedisStore(client, limiter.WithBatching(1, 8))
	t.Cleanup(func() { store.Close() })
	for i := range calls {
		_, err := store.Do(ctx, op("t:{wrongtype}"))
		if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") || limiter.IsUnavailable(err) ||
			limiter.KindOf(err) != limiter.ErrKindScript {
			t.Fatalf("call %d on a key of the wrong type: %v (%s), want WRONGTYPE, about the call", i, err, limiter.KindOf(err))
		}
	}
	if dials := client.PoolStats().Misses; dials != 1 {
		t.Errorf("%d calls answered WRONGTYPE dialled %d connections, want 1 (kept)", calls, dials)
	}
}
