package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// kindRedisRate is -kind 20: go-redis/redis_rate's GCRA (its AllowN, by
// the library itself: one EVALSHA a check, no batching), a peer's script
// beside ours, on the same limit (10,000 a minute, burst 10,000) and keys.
const kindRedisRate = 20

// runRedisRate measures redis_rate's script as run measures ours: -fill
// windows of checks first, then -n checks in 5 rounds, µs in the calls
// (commandstats) and Redis CPU per check. GCRA keeps one string a key, on
// Redis's clock; -per only sets how many checks the fill sends.
func runRedisRate(w io.Writer, addr string, keys, per, n int, fill float64) error {
	ctx := context.Background()
	if addr == "" {
		a, stop, err := startRedis()
		if err != nil {
			return err
		}
		defer stop()
		addr = a
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	checks, describe := redisRate(ctx, c, keys)
	if err := checks(int(fill * float64(per*keys))); err != nil {
		return err
	}
	var us, cpus []string
	for range 5 {
		u, cpu, err := measure(ctx, c, "evalsha", func() error { return checks(n / 5) })
		if err != nil {
			return err
		}
		us, cpus = append(us, perCheck(u, n/5)), append(cpus, perCheck(cpu, n/5))
	}
	fmt.Fprintf(w, "kind %d (go-redis/redis_rate v10 GCRA, AllowN), evalsha, 1 check a call, %d keys (%s)\n", kindRedisRate, keys, describe())
	fmt.Fprintf(w, "redis_rate: µs in the call per check %s; Redis CPU µs per check %s\n", strings.Join(us, " "), strings.Join(cpus, " "))
	return nil
}

// redisRate is redis_rate's checks on c: checks(m) sends m of them, each
// of a random key of keys, and fails on one refused (the limit is far
// above what they send); describe names the last check's key's type and
// encoding (a key lives as long as its state matters, ceil(reset_after)
// seconds: 1 s at one check in a while).
func redisRate(ctx context.Context, c *redis.Client, keys int) (checks func(m int) error, describe func() string) {
	lim := redis_rate.NewLimiter(c)
	limit := redis_rate.PerMinute(10000)
	rng := rand.New(rand.NewPCG(1, 2))
	last := ""
	checks = func(m int) error {
		for range m {
			last = "bench:{k" + strconv.Itoa(rng.IntN(keys)) + "}"
			res, err := lim.AllowN(ctx, last, limit, 1)
			if err != nil {
				return err
			}
			if res.Allowed != 1 {
				return fmt.Errorf("redis_rate refused a check under its limit: %+v", res)
			}
		}
		return nil
	}
	describe = func() string {
		k := "rate:" + last
		return "the last check's key: " + c.Type(ctx, k).Val() + ", " + c.ObjectEncoding(ctx, k).Val()
	}
	return checks, describe
}
