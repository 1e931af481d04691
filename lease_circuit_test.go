package slidingratelimit

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestLeaseGivenBackWhileTheCircuitIsOpen is issue 30's case as a client
// sees it: max_concurrent 2, fail open; two requests of a key hold leases;
// Redis stalls and other keys' timeouts open the circuit; the two requests
// end while it is open; Redis comes back. The key's first request after
// the cool-down gets 200 from Redis, without Retry-After: before the fix,
// 429 {"reason":"concurrency"} with Retry-After 1 and nothing in flight.
func TestLeaseGivenBackWhileTheCircuitIsOpen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "100", Window: caddy.Duration(time.Minute),
		MaxConcurrent: "2", Fail: "open", Redis: &RedisConfig{Addresses: []string{proxy.Addr()}}}
	provision(t, h, nil)
	key := map[string]string{"X-API-Key": "K"}

	inside, leave := make(chan struct{}), make(chan struct{})
	hold := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		inside <- struct{}{}
		<-leave
		w.WriteHeader(http.StatusOK)
		return nil
	})
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Go(func() {
			w, r, _ := newRequest(key)
			_ = h.ServeHTTP(w, r, hold)
			codes[i] = w.Code
		})
		<-inside // its lease is taken
	}

	proxy.Stall(true)
	for i := 0; h.rt.breaker.State() != limiter.Open; i++ {
		if i == 50 {
			t.Fatalf("the circuit did not open after %d requests to a stalled Redis", i)
		}
		if o := mustServe(t, h, map[string]string{"X-API-Key": "other"}); o.code != http.StatusOK {
			t.Fatalf("another key, Redis stalled, fail open: %d", o.code)
		}
	}
	close(leave) // both end while the circuit is open: their releases are held
	wg.Wait()
	if codes[0] != http.StatusOK || codes[1] != http.StatusOK {
		t.Fatalf("the two requests holding leases: %v", codes)
	}
	proxy.Stall(false)
	time.Sleep(400 * time.Millisecond) // the breaker's cool-down (250 ms) on the wall clock

	for i, what := range []string{"the key's first request after the outage", "its next"} {
		o := mustServe(t, h, key)
		if o.code != http.StatusOK || o.source != "redis" || o.header.Get("Retry-After") != "" {
			t.Fatalf("%s (%d): %d from %q, Retry-After %q; want 200 from redis: nothing is in flight",
				what, i+1, o.code, o.source, o.header.Get("Retry-After"))
		}
	}
}
