package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServesTheExample: rls serves examples/rls.yaml and a second domain's
// file on gRPC and /metrics on HTTP: the free plan's 10 a minute per API
// key hold through Envoy's API (the 11th OVER_LIMIT), the health check
// path is unlimited, the second domain has its own rules, an unknown
// domain is OK, and requests_total counts the decisions by rule.
func TestServesTheExample(t *testing.T) {
	t.Parallel()
	second := filepath.Join(t.TempDir(), "messaging.yaml")
	if err := os.WriteFile(second, []byte("domain: messaging\ndescriptors: [{key: to_number, rate_limit: {unit: day, requests_per_unit: 1}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-config", "../../examples/rls.yaml", "-config", second, "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0"}, &stderr,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("rls ended: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("rls did not listen in 30s")
	}
	conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	free := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}, {Key: "plan", Value: "free"}}}
	for i := 1; i <= 11; i++ {
		resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{free}})
		if err != nil {
			t.Fatal(err)
		}
		want := pb.RateLimitResponse_OK
		if i == 11 {
			want = pb.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want {
			t.Fatalf("check %d of the free plan: %v, want %v", i, resp, want)
		}
	}
	health := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/healthz"}}}
	if resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{health}}); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("the unlimited health check: %v %v", resp, err)
	}
	// The second file's domain, and a domain no file has.
	number := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "to_number", Value: "1"}}}
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{number}})
		if err != nil || resp.OverallCode != want {
			t.Fatalf("messaging, check %d: %v %v, want %v", i+1, resp, err, want)
		}
	}
	if resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "nowhere", Descriptors: []*rlv3.RateLimitDescriptor{number, free}}); err != nil ||
		resp.OverallCode != pb.RateLimitResponse_OK || len(resp.Statuses) != 2 || resp.Statuses[1].CurrentLimit != nil {
		t.Fatalf("an unknown domain: %v %v, want OK, two statuses without a limit", resp, err)
	}
	resp, err := http.Get("http://" + a[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sliding_ratelimit_requests_total{limiter="edge.api_key.plan_free",result="allowed"} 10`, // the rule's name is its path
		`sliding_ratelimit_requests_total{limiter="edge.api_key.plan_free",result="denied"} 1`,
		`sliding_ratelimit_requests_total{limiter="messaging.to_number",result="denied"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grepLines(string(body), "requests_total"))
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("rls after cancel: %v", err)
	}
}

// TestCheckAndBadConfig: -check validates the example; a bad config ends
// rls with an error naming the file and the field; so does one domain in
// two files.
func TestCheckAndBadConfig(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	if err := run(t.Context(), []string{"-config", "../../examples/rls.yaml", "-check"}, &stderr, nil); err != nil || !strings.Contains(stderr.String(), "valid configuration of domain edge") {
		t.Fatalf("-check of the example: %v %s", err, stderr.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minutes, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), []string{"-config", bad, "-check"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml: rls config: descriptors[0].rate_limit.unit: invalid rate limit unit 'minutes'") {
		t.Fatalf("bad config: %v", err)
	}
	if err := run(t.Context(), []string{"-config", "../../examples/rls.yaml", "-config", "../../examples/rls.yaml", "-check"}, io.Discard, nil); err == nil ||
		!strings.Contains(err.Error(), "domain: domain 'edge' is in two files") {
		t.Fatalf("one domain twice: %v", err)
	}
	if err := run(t.Context(), nil, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "-config is required") {
		t.Fatalf("no -config: %v", err)
	}
}

// TestNoCaddyInTheDependencies: the service pulls in no Caddy package.
func TestNoCaddyInTheDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/sliding-ratelimit/sliding_ratelimit/limiter\n") ||
		!strings.Contains(string(out), "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3\n") {
		t.Fatalf("go list -deps lists neither the engine nor Envoy's API: the check is broken\n%s", out)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.Contains(d, "caddyserver") {
			t.Errorf("cmd/rls depends on %s", d)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
