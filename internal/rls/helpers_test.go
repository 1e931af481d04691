package rls_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/rls"
)

// clock is a clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// serve loads config, serves it over gRPC on a free 127.0.0.1 port and
// returns a client of the Envoy API connected to it.
func serve(t *testing.T, config string, c *clock) pb.RateLimitServiceClient {
	t.Helper()
	opts := rls.Options{}
	if c != nil {
		opts.Now = c.Now
	}
	svc, err := rls.Load([]byte(config), opts)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(gs, svc)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// check calls ShouldRateLimit.
func check(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// one checks one descriptor of domain and returns its status.
func one(t *testing.T, c pb.RateLimitServiceClient, domain string, d *rlv3.RateLimitDescriptor) (pb.RateLimitResponse_Code, *pb.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	resp := check(t, c, &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if len(resp.Statuses) != 1 {
		t.Fatalf("%d statuses for 1 descriptor", len(resp.Statuses))
	}
	return resp.OverallCode, resp.Statuses[0]
}

// header is a response header's value, "" when absent.
func header(resp *pb.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}
