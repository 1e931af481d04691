package limiter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestBatchingIsExactUnderConcurrency: 500 concurrent checks of one key
// with limit 50 through a batching store admit exactly 50, in batches
// (fewer pipelines than calls), and survive a SCRIPT FLUSH mid-way.
func TestBatchingIsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client, limiter.WithBatching(2, 64))
	t.Cleanup(func() { store.Close() })
	kb, _ := limiter.NewKeyBuilder("t:", "batch", limiter.SlidingLog)
	key := kb.Bucket(randomID(t), false, "")
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			if i == 250 {
				srv.CLI(t, "SCRIPT", "FLUSH")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res, err := store.Allow(ctx, &limiter.Request{Algorithm: limiter.SlidingLog, Window: time.Minute, Now: t0,
				Bucket: limiter.Bucket{Key: key, Limit: 50}})
			switch {
			case err != nil:
				t.Error(err)
			case res.Allowed:
				admitted.Add(1)
			default:
				denied.Add(1)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	if admitted.Load() != 50 || denied.Load() != 450 {
		t.Fatalf("admitted %d denied %d, want 50 and 450", admitted.Load(), denied.Load())
	}
	if calls := scriptCalls(t, srv); calls < 500 {
		t.Fatalf("%d script calls for 500 checks", calls)
	}
}

// TestBatchingHonoursDeadlines: a caller whose deadline passes while Redis
// hangs gets its error at its deadline, not when the batch ends.
func TestBatchingHonoursDeadlines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := limiter.NewRedisStore(srv.Client(t), limiter.WithBatching(1, 8))
	t.Cleanup(func() { store.Close() })
	srv.Pause()
	t.Cleanup(srv.Resume)
	kb, _ := limiter.NewKeyBuilder("t:", "batch", limiter.SlidingLog)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			began := time.Now()
			_, err := store.Allow(ctx, &limiter.Request{Algorithm: limiter.SlidingLog, Window: time.Minute,
				Bucket: limiter.Bucket{Key: kb.Bucket(randomID(t), false, ""), Limit: 5}})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want a deadline", err)
			}
			if took := time.Since(began); took > 250*time.Millisecond {
				t.Errorf("a call with a 100ms deadline took %s", took)
			}
		}()
	}
	wg.Wait()
}
