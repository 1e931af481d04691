package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestWindowNamesThatWouldEscapeAreRefused: a window's name goes into the
// script's JSON shape as it is and names hash fields; Store.Do is public, so
// a name with a quote (which would shift the values the script reads: a
// limit of 1 read where 5 was given), a backslash, a space or a control
// byte is an invalid Op on every store, and nothing is written.
func TestWindowNamesThatWouldEscapeAreRefused(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { client.Close() })
	rs := limiter.NewRedisStore(client)
	t.Cleanup(func() { rs.Close() })
	ms := limiter.NewMemoryStore()
	t.Cleanup(func() { ms.Close() })
	stores := map[string]limiter.Store{"memory": ms, "redis-server": rs}

	minute := time.Minute.Microseconds()
	for name, store := range stores {
		for _, kind := range []limiter.Kind{limiter.KindLog, limiter.KindCounter, limiter.KindFixed, limiter.KindToken} {
			for _, w := range []string{`60000000",1,"`, `a"b`, `a\b`, "a b", "a\x00", "\xff", ""} {
				op := &limiter.Op{Cost: 1, Parts: []limiter.Part{{Key: "t:{names}", Kind: kind,
					Windows: []limiter.Win{{Name: w, Len: minute, Limit: 5}}}}}
				if _, err := store.Do(ctx, op); !errors.Is(err, limiter.ErrInvalidOp) {
					t.Errorf("%s, %s, window name %q: %v, want ErrInvalidOp", name, kind, w, err)
				}
			}
			// The engine's own names pass.
			op := &limiter.Op{Cost: 1, Parts: []limiter.Part{{Key: "t:{names}:" + kind.String(), Kind: kind,
				Windows: []limiter.Win{{Name: limiter.WindowName(time.Minute), Len: minute, Limit: 5}}}}}
			if r, err := store.Do(ctx, op); err != nil || r.Status != limiter.StatusAllowed {
				t.Errorf("%s, %s, window %q: %+v, %v, want allowed", name, kind, op.Parts[0].Windows[0].Name, r, err)
			}
		}
	}
	if n, err := client.Exists(ctx, "t:{names}").Result(); err != nil || n != 0 {
		t.Errorf("the refused checks wrote their key (%d, %v)", n, err)
	}
}
