package slidingratelimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// pingResult is the PING a Redis client sends when it is created: done
// closes when Redis answered, refused or did not answer in time.
type pingResult struct {
	done chan struct{}
	err  error
}

// startPing pings client within d, calling warn when Redis does not
// answer (an outage at start: the fail mode covers it). A refusal
// (WRONGPASS, NOAUTH, NOPERM) is not warned about: the limiters waiting
// for the ping refuse their configuration instead (checkAccess).
func startPing(client redis.UniversalClient, d time.Duration, warn func(error)) *pingResult {
	p := &pingResult{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		p.err = client.Ping(ctx).Err()
		if p.err != nil && !limiter.IsRefusal(p.err) {
			warn(p.err)
		}
	}()
	return p
}

// wait is the ping's error, once it is known (nil for no ping).
func (p *pingResult) wait() error {
	if p == nil {
		return nil
	}
	<-p.done
	return p.err
}

// checkAccess refuses the configuration when a Redis that answers refuses
// it: the password or the user (WRONGPASS, NOAUTH), or the user's
// permissions for the commands and keys the limiter needs (NOPERM, or
// limiter.CheckAccess's list). It asks without writing: a PING and one
// read-only EVAL (redis.acl_check_cmd). A Redis that does not answer is no
// configuration error: it was warned about, and the fail mode covers it.
func (h *Handler) checkAccess() error {
	if h.Redis != nil {
		err := h.rt.redisPing.wait()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), h.Redis.probeTimeout(h.Redis.timeout()))
			err = limiter.CheckAccess(ctx, h.rt.redis, h.rt.lim.Keys().Namespace()+"{access}", false, h.Redis.Scripts == "eval")
			cancel()
		}
		if limiter.IsRefusal(err) {
			return dirErr("redis", "", "%s answered and refused this configuration: %v", h.Redis.target(), err)
		}
	}
	if h.GlobalRedis != nil {
		err := h.rt.ledgerPing.wait()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), h.GlobalRedis.probeTimeout(h.GlobalRedis.ledgerTimeout()))
			err = limiter.CheckAccess(ctx, h.rt.ledgerClient, h.rt.lim.Keys().Namespace()+"{ledger}:members", true, true)
			cancel()
		}
		if limiter.IsRefusal(err) {
			return dirErr("global_redis", "", "%s answered and refused this configuration: %v", h.GlobalRedis.target(), err)
		}
	}
	return nil
}

// probeTimeout bounds one question of checkAccess: a dial and a call.
func (c *RedisConfig) probeTimeout(call time.Duration) time.Duration {
	dial := DefaultDialTimeout
	if c.DialTimeout > 0 {
		dial = time.Duration(c.DialTimeout)
	}
	return dial + call
}
