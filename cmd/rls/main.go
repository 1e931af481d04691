// Command rls is Envoy's rate limit service on this engine: it serves
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC,
// from a YAML configuration in envoyproxy/ratelimit's shape (see
// examples/rls.yaml and docs/migrating.md), and the metrics on HTTP
// /metrics.
//
//	rls -config examples/rls.yaml -grpc :8081 -http :8080
//	rls -config examples/rls.yaml -check
//	rls -config edge.yaml -config messaging.yaml    # one file per domain
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/rls"
)

// metricsServer is the HTTP server of /metrics and /healthcheck, and its
// listener on addr.
func metricsServer(addr string, metrics *rls.Metrics) (*http.Server, net.Listener, error) {
	hl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	for _, c := range metrics.Collectors() {
		reg.MustRegister(c)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "OK\n") })
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, hl, nil
}

// load reads the configuration files, one service each, and routes to
// them by domain.
func load(configs []string, metrics *rls.Metrics) (*rls.Domains, []*rls.Service, []string, error) {
	var svcs []*rls.Service
	var domains []string
	for _, path := range configs {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, svcs, nil, err
		}
		f, err := rls.Parse(data)
		if err != nil {
			return nil, svcs, nil, fmt.Errorf("%s: %w", path, err)
		}
		svc, err := rls.New(f, rls.Options{Metrics: metrics})
		if err != nil {
			return nil, svcs, nil, fmt.Errorf("%s: %w", path, err)
		}
		svcs, domains = append(svcs, svc), append(domains, f.Domain)
	}
	router, err := rls.NewDomains(svcs...)
	return router, svcs, domains, err
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "rls:", err)
		os.Exit(1)
	}
}

// run is the command: it serves until ctx ends or a SIGINT or SIGTERM
// comes. ready, when set, is told the listeners' addresses.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(grpcAddr, httpAddr string)) error {
	fs := flag.NewFlagSet("rls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var configs []string
	fs.Func("config", "a YAML configuration file, one domain (required; repeat it for several domains)", func(v string) error {
		configs = append(configs, v)
		return nil
	})
	grpcAddr := fs.String("grpc", ":8081", "the gRPC listen address")
	httpAddr := fs.String("http", ":8080", "the HTTP listen address of /metrics and /healthcheck (\"\" for none)")
	check := fs.Bool("check", false, "check the configuration and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(configs) == 0 {
		return errors.New("-config is required (a YAML file: domain, descriptors, ...)")
	}
	metrics := rls.NewMetrics("")
	router, svcs, domains, err := load(configs, metrics)
	defer func() {
		for _, s := range svcs {
			_ = s.Close()
		}
	}()
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(stderr, "%s: valid configuration of domain %s\n", strings.Join(configs, ", "), strings.Join(domains, ", "))
		return nil
	}
	gl, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(gs, router)
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	defer gs.Stop()
	hAddr := ""
	if *httpAddr != "" {
		hs, hl, err := metricsServer(*httpAddr, metrics)
		if err != nil {
			return err
		}
		go func() { errc <- hs.Serve(hl) }()
		defer hs.Close()
		hAddr = hl.Addr().String()
	}
	fmt.Fprintf(stderr, "rls: domain %s, gRPC on %s, HTTP on %s\n", strings.Join(domains, ", "), gl.Addr(), hAddr)
	if ready != nil {
		ready(gl.Addr().String(), hAddr)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		gs.GracefulStop()
		return nil
	case err := <-errc:
		return err
	}
}
