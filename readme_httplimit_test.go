package slidingratelimit

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// readmeNetHTTP returns the two commands of the README's "Go's net/http"
// section: the one that runs the example and the one that tests it.
func readmeNetHTTP(t *testing.T) (run, test string) {
	t.Helper()
	block := regexp.MustCompile("(?s)```\n(.*?)```").FindStringSubmatch(readmeSection(t, "Go's net/http"))
	if block == nil {
		t.Fatal("README's Go's net/http section has no code block")
	}
	for _, line := range strings.Split(block[1], "\n") {
		cmd, comment, _ := strings.Cut(line, "#")
		switch cmd = strings.TrimSpace(cmd); {
		case strings.HasPrefix(comment, " run it"):
			run = cmd
		case strings.HasPrefix(comment, " test it"):
			test = cmd
		}
	}
	if run == "" || test == "" {
		t.Fatalf("README's Go's net/http block must hold a '# run it' and a '# test it' command:\n%s", block[1])
	}
	return run, test
}

// TestReadmeNetHTTP: the README's net/http commands are what they say. The
// test command tests the middleware's package; the run command's program,
// built as it names it, serves 5 requests per 10 s per client IP in
// process, and with REDIS_ADDR on that Redis, with the metrics at /metrics.
func TestReadmeNetHTTP(t *testing.T) {
	t.Parallel()
	run, test := readmeNetHTTP(t)
	if test != "go test -race -count=1 ./httplimit" {
		t.Errorf("README's net/http test command is %q, want the middleware's package tested with the race detector", test)
	}
	pkg, ok := strings.CutPrefix(run, "go run ")
	if !ok || strings.Contains(pkg, " ") {
		t.Fatalf("README's net/http run command %q is not `go run <package>`", run)
	}
	bin := filepath.Join(t.TempDir(), "httplimit-example")
	build := exec.Command("nice", "-n", "5", "go", "build", "-o", bin, pkg)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	redis := redistest.Start(t)
	for _, redisAddr := range []string{"", redis.Addr()} {
		addr := freeAddr(t)
		cmd := exec.Command(bin, "-addr", addr)
		cmd.Env = append(os.Environ(), "REDIS_ADDR="+redisAddr)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		base := "http://" + addr
		waitServing(t, base+"/metrics")
		for i := 1; i <= 6; i++ {
			resp, err := http.Get(base + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusOK
			if i == 6 {
				want = http.StatusTooManyRequests
			}
			if resp.StatusCode != want {
				t.Fatalf("REDIS_ADDR=%q, request %d: %d %q, want %d", redisAddr, i, resp.StatusCode, body, want)
			}
			if i == 6 && (!strings.HasPrefix(string(body), `{"error":"rate_limited","retry_after":`) || resp.Header.Get("Retry-After") == "") {
				t.Errorf("REDIS_ADDR=%q, the sixth request: %q, Retry-After %q", redisAddr, body, resp.Header.Get("Retry-After"))
			}
		}
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, series := range []string{`sliding_ratelimit_requests_total{limiter="example",result="allowed"} 5`,
			`sliding_ratelimit_requests_total{limiter="example",result="denied"} 1`} {
			if !strings.Contains(string(metrics), series) {
				t.Errorf("REDIS_ADDR=%q: /metrics has no %s", redisAddr, series)
			}
		}
	}
}

// waitServing waits (at most a minute, for a loaded machine) until url
// answers.
func waitServing(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
