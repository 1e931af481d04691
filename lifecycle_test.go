package slidingratelimit

// A request's whole life: requests in flight, counting by the response,
// waiting for a turn instead of a 429, and gRPC clients.

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestConcurrencyAcrossNodes: `max_concurrent 3` on three nodes sharing a
// Redis; 30 slow requests of one key at once, spread over the nodes: the
// upstream never sees more than 3 at a time, the others get 429, and no
// lease is left in Redis afterwards. A node that dies holding a lease (its
// request never ends) loses it after lease_timeout (on an injected clock:
// clock app).
func TestConcurrencyAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	name := uniqueName()
	clock := newTestClock()
	hs := nodes(t, 3, srv, clock, func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "1000", Window: caddy.Duration(time.Minute),
			MaxConcurrent: "3", LeaseTimeout: caddy.Duration(2 * time.Second)}
	})
	var inFlight, most atomic.Int64
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
		return nil
	})
	hdr := map[string]string{"X-API-Key": "k"}
	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(h *Handler) {
			defer wg.Done()
			w, r, _ := newRequest(hdr)
			if err := h.ServeHTTP(w, r, slow); err != nil {
				t.Error(err)
			}
			switch w.Code {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				limited.Add(1)
				if w.Header().Get("Retry-After") == "" {
					t.Error("a 429 without Retry-After")
				}
			default:
				t.Errorf("status %d", w.Code)
			}
		}(hs[i%3])
	}
	wg.Wait()
	if most.Load() > 3 || ok.Load() < 3 || limited.Load() == 0 {
		t.Fatalf("upstream saw up to %d at once; %d passed, %d limited", most.Load(), ok.Load(), limited.Load())
	}
	leaseKey := hs[0].rt.lim.Keys().Key("lease", "k", false, "")
	if n := srv.CLI(t, "ZCARD", leaseKey); n != "0" {
		t.Fatalf("%s leases left in Redis after every request ended", n)
	}

	// A node dies with a request in flight: its lease is never released.
	in := &limiter.Input{Identity: "k", Limits: []int64{1000}, Cost: 1, MaxConcurrent: 3}
	for i := 0; i < 3; i++ {
		if d, err := hs[0].rt.lim.Decide(context.Background(), in); err != nil || !d.Pass {
			t.Fatalf("lease %d: %+v %v", i, d, err)
		}
	}
	if w := serve(t, hs[1], hdr); w.Code != http.StatusTooManyRequests {
		t.Fatalf("with 3 leases held by a dead node: %d, want 429", w.Code)
	}
	clock.Advance(1900 * time.Millisecond)
	if w := serve(t, hs[1], hdr); w.Code != http.StatusTooManyRequests {
		t.Fatalf("before lease_timeout: %d, want 429 (the dead node's leases still held)", w.Code)
	}
	clock.Advance(200 * time.Millisecond)
	if w := serve(t, hs[1], hdr); w.Code != http.StatusOK {
		t.Fatalf("after lease_timeout: %d, want 200", w.Code)
	}
}

// TestCountOnlyFailedLogins: `count_only status 401` with limit 3: logins
// that succeed are never counted; the fourth failed login in the window is
// refused before it runs.
func TestCountOnlyFailedLogins(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-User}", Limit: "3", Window: caddy.Duration(time.Minute),
				CountOnly: []string{"401"}}
			if store == "redis" {
				srv := redistest.Start(t)
				h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(5 * time.Second)}
			}
			provision(t, h, newTestClock())
			login := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if r.Header.Get("X-Password") != "right" {
					w.WriteHeader(http.StatusUnauthorized)
					return nil
				}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			try := func(password string) int {
				w, r, _ := newRequest(map[string]string{"X-User": "alice", "X-Password": password})
				if err := h.ServeHTTP(w, r, login); err != nil {
					t.Fatal(err)
				}
				return w.Code
			}
			for i := 0; i < 10; i++ {
				if c := try("right"); c != http.StatusOK {
					t.Fatalf("successful login %d: %d", i+1, c)
				}
			}
			for i := 0; i < 3; i++ {
				if c := try("wrong"); c != http.StatusUnauthorized {
					t.Fatalf("failed login %d: %d, want 401 (not yet limited)", i+1, c)
				}
			}
			if c := try("wrong"); c != http.StatusTooManyRequests {
				t.Fatalf("4th failed login: %d, want 429", c)
			}
			if c := try("right"); c != http.StatusTooManyRequests {
				t.Fatalf("a login once the key is at its limit: %d, want 429 (checked before it runs)", c)
			}
		})
	}
}

// TestCountOnlyOvershoot: requests of one key that all pass the check
// before any of them is counted (they run at once) are all counted after:
// the overshoot is bounded by the requests in flight at once.
func TestCountOnlyOvershoot(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), CountOnly: []string{"5xx"}}
	provision(t, h, newTestClock())
	release := make(chan struct{})
	var started sync.WaitGroup
	failing := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		started.Done()
		<-release
		w.WriteHeader(http.StatusBadGateway)
		return nil
	})
	const concurrent = 8
	started.Add(concurrent)
	var wg sync.WaitGroup
	for i := 0; i < concurrent; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, r, _ := newRequest(nil)
			if err := h.ServeHTTP(w, r, failing); err != nil || w.Code != http.StatusBadGateway {
				t.Errorf("%d %v", w.Code, err)
			}
		}()
	}
	started.Wait() // all 8 passed the check: nothing counted yet
	close(release)
	wg.Wait()
	in, err := h.adminInput(map[string][]string{"key": {""}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.rt.lim.Peek(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if d.Windows[0].Count != concurrent || d.Pass {
		t.Fatalf("after %d concurrent failures: count %d, pass %v; want all %d counted (limit 3 + 5 in flight), and the key refused",
			concurrent, d.Windows[0].Count, d.Pass, concurrent)
	}
}

// TestQueueWaitsForItsTurn: `limit 2 2s` with `queue 3s`: a third request
// waits (no 429) and completes within the window; with `queue 500ms` it
// gets the 429 at once; `max_waiters` 1 refuses a second waiter at once.
func TestQueueWaitsForItsTurn(t *testing.T) {
	t.Parallel()
	mk := func(wait time.Duration, waiters int) *Handler {
		h := &Handler{Name: uniqueName(), Limits: []LimitConfig{{Limit: "2", Window: caddy.Duration(2 * time.Second)}},
			Queue: &QueueConfig{MaxWait: caddy.Duration(wait), MaxWaiters: waiters}}
		provision(t, h, nil) // real time: waiting is the point
		return h
	}
	t.Run("waits", func(t *testing.T) {
		t.Parallel()
		h := mk(3*time.Second, 0)
		serve(t, h, nil)
		serve(t, h, nil)
		began := time.Now()
		w, r, repl := newRequest(nil)
		if err := h.ServeHTTP(w, r, nextOK); err != nil || w.Code != http.StatusOK {
			t.Fatalf("third request: %d %v, want 200 after waiting", w.Code, err)
		}
		if took := time.Since(began); took < time.Second || took > 3*time.Second {
			t.Errorf("the third request took %s, want its turn within the 2 s window", took)
		}
		if v, _ := repl.GetString("http.sliding_ratelimit.outcome"); v != "allowed" {
			t.Errorf("outcome %q", v)
		}
	})
	t.Run("dry run", func(t *testing.T) {
		// A dry run refuses nothing, so nothing waits: the would-be 429
		// passes at once (it used to wait for its turn first).
		t.Parallel()
		h := &Handler{Name: uniqueName(), Limits: []LimitConfig{{Limit: "2", Window: caddy.Duration(2 * time.Second)}},
			Queue: &QueueConfig{MaxWait: caddy.Duration(3 * time.Second)}, DryRun: true}
		provision(t, h, nil)
		serve(t, h, nil)
		serve(t, h, nil)
		began := time.Now()
		w, r, repl := newRequest(nil)
		if err := h.ServeHTTP(w, r, nextOK); err != nil || w.Code != http.StatusOK {
			t.Fatalf("third request: %d %v, want 200 (dry run)", w.Code, err)
		}
		if took := time.Since(began); took > time.Second {
			t.Errorf("the dry run's would-be refusal took %s: it waited for a turn it did not need", took)
		}
		if v, _ := repl.GetString("http.sliding_ratelimit.dry_run"); v != "true" {
			t.Errorf("dry_run placeholder %q, want true (the request would have been refused)", v)
		}
	})
	t.Run("too long to wait", func(t *testing.T) {
		t.Parallel()
		h := mk(500*time.Millisecond, 0)
		serve(t, h, nil)
		serve(t, h, nil)
		began := time.Now()
		if w := serve(t, h, nil); w.Code != http.StatusTooManyRequests {
			t.Fatalf("third request: %d, want 429", w.Code)
		}
		if took := time.Since(began); took > 400*time.Millisecond {
			t.Errorf("the refusal took %s, want it at once", took)
		}
	})
	t.Run("max waiters", func(t *testing.T) {
		t.Parallel()
		h := mk(3*time.Second, 1)
		serve(t, h, nil)
		serve(t, h, nil)
		first := make(chan int)
		go func() { // no t.Fatal off the test's goroutine
			w, err := serveErr(t, h, nil)
			if err != nil {
				t.Errorf("first waiter: %v", err)
			}
			first <- w.Code
		}()
		time.Sleep(200 * time.Millisecond) // the first waiter is waiting
		began := time.Now()
		if w := serve(t, h, nil); w.Code != http.StatusTooManyRequests || time.Since(began) > 400*time.Millisecond {
			t.Errorf("second waiter: %d after %s, want 429 at once", w.Code, time.Since(began))
		}
		if c := <-first; c != http.StatusOK {
			t.Errorf("first waiter: %d, want 200", c)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		t.Parallel()
		h := mk(3*time.Second, 0)
		serve(t, h, nil)
		serve(t, h, nil)
		w, r, _ := newRequest(nil)
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		defer cancel()
		began := time.Now()
		_ = h.ServeHTTP(w, r.WithContext(ctx), nextOK)
		if took := time.Since(began); took > time.Second {
			t.Errorf("a client gone after 200ms kept its request waiting %s", took)
		}
	})
}

// TestGRPCResourceExhausted: a gRPC client (google.golang.org/grpc) calls a
// gRPC server through Caddy's reverse_proxy over h2c; past the limit it
// sees RESOURCE_EXHAUSTED, not UNAVAILABLE or an internal error.
func TestGRPCResourceExhausted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	name := uniqueName()
	tester := newTester(t)
	tester.InitServer(`{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
	servers :9080 {
		protocols h1 h2c
	}
}
http://:9080 {
	sliding_ratelimit {
		name   `+name+`
		limit  2
		window 1m
	}
	reverse_proxy h2c://`+ln.Addr().String()+`
}
`, "caddyfile")
	conn, err := grpc.NewClient("127.0.0.1:9080", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("third call: %v (%s), want RESOURCE_EXHAUSTED", err, got)
	}
	t.Logf("third call: %v", err)
}
