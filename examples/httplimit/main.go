// Command httplimit is a tiny net/http server behind the rate limiter's
// middleware: 5 requests per 10 seconds per client IP, the same policy as
// examples/Caddyfile, with the limiter's metrics at /metrics.
//
//	go run ./examples/httplimit                       # in process, on :8080
//	REDIS_ADDR=localhost:6379 go run ./examples/httplimit   # on a Redis shared by every instance
//
// Then: curl -i localhost:8080/ (the sixth request in 10 s gets a 429).
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/httplimit"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	redisAddr := flag.String("redis", os.Getenv("REDIS_ADDR"), "host:port of a Redis to share the state through (default $REDIS_ADDR; empty: in process)")
	flag.Parse()
	if err := run(*addr, *redisAddr); err != nil {
		log.Fatal(err)
	}
}

func run(addr, redisAddr string) error {
	metrics := httplimit.NewMetrics("")
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.Collectors()...)

	cfg := httplimit.Config{
		Name:    "example",
		Limits:  []httplimit.Limit{{Limit: 5, Window: 10 * time.Second}},
		Metrics: metrics,
	}
	if redisAddr != "" {
		cfg.Redis = &httplimit.RedisConfig{Addresses: []string{redisAddr}}
	}
	lim, err := httplimit.New(cfg)
	if err != nil {
		return err
	}
	defer lim.Close()

	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	mux := http.NewServeMux()
	mux.Handle("/", lim.Middleware(app))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	store := "in process"
	if redisAddr != "" {
		store = "on Redis " + redisAddr
	}
	fmt.Printf("listening on http://%s/ (5 requests per 10s per client IP, %s)\n", addr, store)
	return http.ListenAndServe(addr, mux)
}
