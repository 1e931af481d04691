package slidingratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// BenchmarkHandler measures the handler's hot path (key, check, headers,
// placeholders) per store and algorithm, admitted requests over many keys,
// and a hot key over its limit (denied; on Redis served by the deny cache).
//
//	go test -run '^$' -bench BenchmarkHandler -benchmem .
func BenchmarkHandler(b *testing.B) {
	srv := redistest.Start(b)
	// baseline: the same loop (request, replacer, recorder) with no limiter,
	// to subtract from the others. The replacer is set up as Caddy's server
	// sets it up (its HTTP placeholders mapped), so the key's
	// {http.request.header.X-Key} resolves, as it does in Caddy.
	b.Run("baseline", func(b *testing.B) { runBench(b, nil, benchKeys) })
	algs := []string{"sliding_log", "sliding_counter", "fixed_window", "token_bucket"}
	for _, store := range []string{"memory", "redis"} {
		for _, alg := range algs {
			b.Run(store+"/"+alg+"/admitted", func(b *testing.B) {
				h := benchHandler(b, store, alg, srv, "10000") // 100,000 keys: every request admitted
				runBench(b, h, benchKeys)
			})
		}
		b.Run(store+"/sliding_log/hot_denied", func(b *testing.B) {
			h := benchHandler(b, store, "sliding_log", srv, "10")
			runBench(b, h, 0)
		})
	}
	// The in-process store pays for a key it has not seen (its state); the
	// rows above see a new key on nearly every request. Here 1,000 keys,
	// each seen before the timer starts: what a request of a known key
	// costs. (A counter: a sliding log's state grows with each request.)
	b.Run("memory/sliding_counter/admitted_known_keys", func(b *testing.B) {
		h := benchHandler(b, "memory", "sliding_counter", srv, "10000000")
		runBench(b, h, -1000)
	})
}

// benchKeys is the key space of the admitted rows.
const benchKeys = 100000

// runBench sends b.N requests to h (nil: none, the harness alone), over
// keys distinct keys; 0 is one hot key, and -n is n keys each sent a
// request before the timer starts.
func runBench(b *testing.B, h *Handler, keys int) {
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	request := func(w *httptest.ResponseRecorder, key string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		// The request's vars, as Caddy's server makes them for each
		// request (the handler keeps its placeholder state there).
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey,
			map[string]any{caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: "192.0.2.1"}))
		r.Header.Set("X-Key", key)
		caddyhttp.NewTestReplacer(r)
		for k := range w.Header() {
			delete(w.Header(), k)
		}
		if h == nil {
			next.ServeHTTP(w, r)
			return
		}
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
	if keys < 0 {
		keys = -keys
		w := httptest.NewRecorder()
		for i := range keys {
			request(w, "k"+strconv.Itoa(i))
		}
	}
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := httptest.NewRecorder()
		for pb.Next() {
			key := "hot"
			if keys > 0 {
				key = "k" + strconv.FormatInt(seq.Add(1)%int64(keys), 10)
			}
			request(w, key)
		}
	})
	b.StopTimer()
	// No request's key resolved to nothing (the empty key's shared
	// budget): the rows measure the keys they say.
	if h != nil {
		if n := testutil.ToFloat64(h.rt.metrics.EmptyKeys); n != 0 {
			b.Fatalf("%v requests had an empty key", n)
		}
	}
}

func benchHandler(b *testing.B, store, alg string, srv *redistest.Server, limit string) *Handler {
	h := &Handler{Name: "bench_" + alg + "_" + store + "_" + limit, Algorithm: alg,
		Key: "{http.request.header.X-Key}", Limit: Amount(limit), Window: caddy.Duration(time.Hour), WarnAt: -1}
	if store == "redis" {
		h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(time.Second)}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(func() { h.Cleanup(); cancel() })
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	h.rt.logger = zap.NewNop()
	return h
}
