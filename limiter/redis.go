package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// ErrBadReply is wrapped by errors about a script reply of the wrong shape.
var ErrBadReply = errors.New("malformed reply from redis script")

// scripts holds one script per algorithm, indexed by Algorithm.
var scripts = [...]*redis.Script{
	SlidingLog:     redis.NewScript(lua.SlidingLog),
	SlidingCounter: redis.NewScript(lua.SlidingCounter),
	FixedWindow:    redis.NewScript(lua.FixedWindow),
	TokenBucket:    redis.NewScript(lua.TokenBucket),
}

// Every algorithm has its script.
var _ = [1]struct{}{}[len(scripts)-len(algorithmNames)]

// RedisStore decides requests with one Lua script call per request (EVALSHA,
// and EVAL when Redis answers NOSCRIPT, as after a restart). It works with a
// single Redis, a Sentinel-managed one or a Redis Cluster: all keys of one
// call share a hash tag. The client belongs to the caller; the store never
// closes it.
type RedisStore struct {
	client redis.Scripter
	batch  *batcher // nil: one round trip per call
	// idPrefix makes request ids unique across processes; seq across calls.
	idPrefix string
	seq      atomic.Uint64
}

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore)

// WithBatching sends the calls of concurrent requests together, in one
// pipeline per batch of at most maxBatch calls, on workers concurrent
// pipelines. Each call stays one atomic script; batching trades a wait of
// at most one batch for far fewer round trips and system calls under load.
// The client must be able to pipeline (every go-redis client can).
func WithBatching(workers, maxBatch int) RedisOption {
	return func(s *RedisStore) {
		p, ok := s.client.(interface{ Pipeline() redis.Pipeliner })
		if !ok || workers <= 0 || maxBatch <= 1 {
			return
		}
		s.batch = newBatcher(p.Pipeline, workers, maxBatch)
	}
}

// NewRedisStore returns a store that runs its scripts on client. Close it
// when done if it batches.
func NewRedisStore(client redis.Scripter, opts ...RedisOption) *RedisStore {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &RedisStore{client: client, idPrefix: hex.EncodeToString(b[:]) + "-"}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close stops the batching workers, if any. It does not close the client.
func (s *RedisStore) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	return nil
}

// Allow implements Store.
func (s *RedisStore) Allow(ctx context.Context, req *Request) (Result, error) {
	return s.run(ctx, req, "0")
}

// Peek implements Store.
func (s *RedisStore) Peek(ctx context.Context, req *Request) (Result, error) {
	return s.run(ctx, req, "1")
}

// Reset implements Store. The keys must share a hash tag on a cluster.
func (s *RedisStore) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	c, ok := s.client.(redis.Cmdable)
	if !ok {
		return errors.New("redis client cannot delete keys")
	}
	return c.Del(ctx, keys...).Err()
}

func (s *RedisStore) run(ctx context.Context, req *Request, mode string) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	var now int64
	if !req.Now.IsZero() {
		now = unixMicros(req.Now)
	}
	member := s.idPrefix + strconv.FormatUint(s.seq.Add(1), 36)

	keys := make([]string, 1, 2)
	keys[0] = req.Bucket.Key
	args := make([]any, 0, 9)
	args = append(args, now, micros(req.Window), req.cost(), mode, member, req.Bucket.Limit, req.Bucket.Burst)
	if req.HasGlobal() {
		keys = append(keys, req.Global.Key)
		args = append(args, req.Global.Limit, req.Global.Burst)
	}

	var vals []int64
	var err error
	if s.batch != nil {
		vals, err = s.batch.do(ctx, scripts[req.Algorithm], keys, args)
	} else {
		vals, err = scripts[req.Algorithm].Run(ctx, s.client, keys, args...).Int64Slice()
	}
	if err != nil {
		return Result{}, err
	}
	if len(vals) != 1+3*len(keys) {
		return Result{}, fmt.Errorf("%w: %d values for %d keys", ErrBadReply, len(vals), len(keys))
	}
	res := Result{Allowed: vals[0] == 1}
	res.Bucket = usage(req.capacity(&req.Bucket), vals[1], vals[2], vals[3], vals[2] > 0)
	if len(keys) == 2 {
		res.Global = usage(req.capacity(&req.Global), vals[4], vals[5], vals[6], vals[5] > 0)
	}
	if !res.Allowed && !res.Bucket.Denied && !res.Global.Denied {
		return Result{}, fmt.Errorf("%w: denied with no retry time", ErrBadReply)
	}
	res.finish()
	return res, nil
}

// IsUnavailable reports whether err says Redis cannot serve requests at all
// (as opposed to an error about one request): a network error, a timeout, a
// full pool, a closed client, an authentication failure, or a reply saying
// the server is loading, busy, read-only, out of memory or without a master.
// The circuit breaker counts only these.
func IsUnavailable(err error) bool {
	if err == nil || errors.Is(err, ErrBadReply) || errors.Is(err, ErrInvalidRequest) {
		return false
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	var re redis.Error
	if !errors.As(err, &re) {
		// Not a reply from Redis: connection-level trouble (TLS, dial).
		return true
	}
	msg := re.Error()
	for _, p := range unavailablePrefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

var unavailablePrefixes = []string{
	"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM",
	"WRONGPASS", "NOAUTH", "MISCONF",
}
