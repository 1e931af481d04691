package slidingratelimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestReleaseAcrossRedisReload: a reload that changes the redis block (a
// new client for the same Redis) while a request is in flight. The old
// handler is cleaned up, as Caddy does once the new config runs, before the
// request ends; its lease is still released and its count_only units still
// recorded in Redis: the key's next request, on the new config, gets the
// place, and the failed login counts.
func TestReleaseAcrossRedisReload(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	name := uniqueName()
	mk := func(timeout time.Duration) *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "10", Window: caddy.Duration(time.Hour),
			MaxConcurrent: "1", CountOnly: []string{"401"},
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(timeout)}}
	}
	old := mk(time.Second)
	provision(t, old, nil)
	hdr := map[string]string{"X-API-Key": "k"}
	started, finish, ended := make(chan struct{}), make(chan struct{}), make(chan int)
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		close(started)
		<-finish
		w.WriteHeader(http.StatusUnauthorized)
		return nil
	})
	go func() {
		w, r, _ := newRequest(hdr)
		if err := old.ServeHTTP(w, r, slow); err != nil {
			t.Error(err)
		}
		ended <- w.Code
	}()
	<-started

	// The reload: the new config runs, then the old one is cleaned up.
	nw := mk(2 * time.Second)
	provision(t, nw, nil)
	if nw.storeKey == old.storeKey {
		t.Fatal("the new redis block shares the old client; the test needs another")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	close(finish)
	if code := <-ended; code != http.StatusUnauthorized {
		t.Fatalf("the request in flight across the reload: %d", code)
	}

	leaseKey := nw.lim.Keys().Key("lease", "k", false, "")
	if n := srv.CLI(t, "ZCARD", leaseKey); n != "0" {
		t.Errorf("%s leases left in Redis after the request in flight across the reload ended", n)
	}
	in := &limiter.Input{Identity: "k", Limits: []int64{10}, Cost: 1, MaxConcurrent: 1}
	if d, err := nw.lim.Peek(context.Background(), in); err != nil || d.Windows[0].Count != 1 {
		t.Errorf("the key's window after the failed login that ended after the reload: %+v %v, want a count of 1", d.Windows, err)
	}
	if w := serve(t, nw, hdr); w.Code != http.StatusOK {
		t.Errorf("the key's next request, on the new config: %d, want 200 (max_concurrent 1, nothing in flight)", w.Code)
	}
}
