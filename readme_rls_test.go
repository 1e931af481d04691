package slidingratelimit

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestReadmeEnvoyRLS: the README's "Envoy's rate limit service" commands
// are what they say. The test command tests the service's packages with
// the race detector; the run command's program, built as it names it,
// serves examples/rls.yaml over Envoy's gRPC API (its free plan's 10 a
// minute hold: the 11th is OVER_LIMIT) with /metrics on HTTP.
func TestReadmeEnvoyRLS(t *testing.T) {
	t.Parallel()
	block := regexp.MustCompile("(?s)```\n(.*?)```").FindStringSubmatch(readmeSection(t, "Envoy's rate limit service"))
	if block == nil {
		t.Fatal("README's Envoy's rate limit service section has no code block")
	}
	var run, test string
	for _, line := range strings.Split(block[1], "\n") {
		cmd, comment, _ := strings.Cut(line, "#")
		switch cmd = strings.TrimSpace(cmd); {
		case strings.HasPrefix(comment, " run it"):
			run = cmd
		case strings.HasPrefix(comment, " test it"):
			test = cmd
		}
	}
	if test != "go test -race -count=1 ./cmd/rls ./internal/rls" {
		t.Errorf("README's rls test command is %q, want the service's packages tested with the race detector", test)
	}
	args := strings.Fields(run)
	if len(args) < 3 || strings.Join(args[:3], " ") != "go run ./cmd/rls" {
		t.Fatalf("README's rls run command %q is not `go run ./cmd/rls ...`", run)
	}
	bin := filepath.Join(t.TempDir(), "rls")
	if out, err := exec.Command("nice", "-n", "5", "go", "build", "-o", bin, args[2]).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", args[2], err, out)
	}
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, append(args[3:], "-grpc", grpcAddr, "-http", httpAddr)...) // the last flag wins: free ports
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitServing(t, "http://"+httpAddr+"/healthcheck")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	free := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k"}, {Key: "plan", Value: "free"}}}
	for i := 1; i <= 11; i++ {
		resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{free}})
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 11; (resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT) != want {
			t.Fatalf("check %d of the free plan: %v", i, resp)
		}
	}
}
