package main

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHistQuantiles(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}} {
		got := h.quantile(c.q)
		if diff := float64(got-c.want) / float64(c.want); diff < -0.02 || diff > 0.02 {
			t.Errorf("quantile(%v) = %v, want %v within 2%%", c.q, got, c.want)
		}
	}
	// Every value lands in a bucket whose midpoint is within 1.6%.
	for v := int64(1); v < 1<<40; v = v*3/2 + 1 {
		got := histValue(histIndex(v))
		if d := float64(got-v) / float64(v); d < -0.016 || d > 0.016 {
			t.Fatalf("value %d reads back as %d", v, got)
		}
	}
	var empty hist
	if empty.quantile(0.99) != 0 {
		t.Error("empty histogram: want 0")
	}
}

func TestReadResponse(t *testing.T) {
	in := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" +
		"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"e\r\n2;x=y\r\n\"}\r\n0\r\n\r\n" +
		"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" +
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
	br := bufio.NewReader(strings.NewReader(in))
	want := []struct {
		status int
		keep   bool
	}{{200, true}, {429, true}, {500, false}}
	for i, w := range want {
		status, keep, err := readResponse(br)
		if err != nil || status != w.status || keep != w.keep {
			t.Fatalf("response %d: got %d %v %v, want %d %v", i, status, keep, err, w.status, w.keep)
		}
	}
	if _, _, err := readResponse(br); err == nil {
		t.Fatal("truncated response: want an error")
	}
	if _, _, err := readResponse(bufio.NewReader(strings.NewReader("garbage\r\n"))); !errors.Is(err, errBadResponse) {
		t.Fatalf("garbage: got %v", err)
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 3s test @ http://127.0.0.1:39799/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.10ms    1.22ms  40.17ms   90.12%
    Req/Sec    15.32k     1.10k   17.50k    70.00%
  Latency Distribution
     50%    1.71ms
     75%    2.30ms
     90%    3.20ms
     99%  830.00us
  92277 requests in 3.01s, 10.56MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  30464.12
Transfer/sec:      3.49MB
BENCH_STATUS 92270 5 2
`
	m, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.ReqPerSec != 30464.12 || m.P50 != 1710*time.Microsecond || m.P99 != 830*time.Microsecond ||
		m.Responses != 92277 || m.Errors != 3 || m.S2xx != 92270 || m.S429 != 5 || m.SOther != 2 {
		t.Fatalf("parsed %+v", m)
	}
	if _, err := parseWrk(strings.Replace(out, "BENCH_STATUS", "X", 1)); err == nil {
		t.Fatal("no BENCH_STATUS: want an error")
	}
}

func TestParseScriptCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_ping:calls=3,usec=1\r\ncmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=2,usec=30\r\ncmdstat_zadd:calls=100,usec=50\r\n"
	if got := parseScriptCalls(info); got != 102 {
		t.Fatalf("got %d, want 102", got)
	}
}

func TestSelectSitesAndCaddyfile(t *testing.T) {
	ss, err := selectSites("redis_log, none")
	if err != nil || len(ss) != 2 || ss[0].Name != "none" || ss[1].Name != "redis_log" {
		t.Fatalf("got %v %v", ss, err)
	}
	if _, err := selectSites("none,nope"); err == nil {
		t.Fatal("unknown site: want an error")
	}
	all, _ := selectSites("all")
	ports := map[string]int{}
	for i, s := range all {
		ports[s.Name] = 20000 + i
	}
	cf := caddyfile(19999, all, ports, "redis://127.0.0.1:1234")
	for _, want := range []string{
		"admin 127.0.0.1:19999", "auto_https off", "http://127.0.0.1:20000 {", "bind 127.0.0.1",
		"redis redis://127.0.0.1:1234", "algorithm token_bucket", "deny_cache off", `respond "ok" 200`,
	} {
		if !strings.Contains(cf, want) {
			t.Errorf("Caddyfile lacks %q:\n%s", want, cf)
		}
	}
	if strings.Contains(cf, "%REDIS%") || strings.Contains(cf, "6379") {
		t.Errorf("bad Caddyfile:\n%s", cf)
	}
}

func TestCaddyError(t *testing.T) {
	out := `{"level":"info","msg":"using config from file"}
{"level":"error","msg":"adapting config using caddyfile: unrecognized sliding_ratelimit subdirective 'deny_cache', at x:20"}
`
	if got := caddyError(out, errors.New("exit status 1")); !strings.Contains(got, "unrecognized sliding_ratelimit subdirective 'deny_cache'") {
		t.Fatalf("got %q", got)
	}
	if got := caddyError("Error: loading config: boom\n", errors.New("exit status 1")); got != "Error: loading config: boom" {
		t.Fatalf("got %q", got)
	}
}

// TestGoLoad runs the Go generator against a local server, closed loop and
// paced, and checks statuses, keys and the paced rate.
func TestGoLoad(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Key")
		mu.Lock()
		keys[k]++
		mu.Unlock()
		if k == "hot" {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":"rate_limited"}`))
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	measured := false
	r := runGoLoad(context.Background(), loadSpec{
		Addr: addr, Keys: 1000, Conns: 4, Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond,
		OnMeasure: func() { measured = true },
	})
	if !measured || r.Responses == 0 || r.S2xx != r.Responses || r.Errors != 0 || r.Latency.total != r.Responses {
		t.Fatalf("closed loop: %+v (OnMeasure called: %v)", r, measured)
	}
	mu.Lock()
	if len(keys) < 100 {
		t.Errorf("want many distinct keys, got %d", len(keys))
	}
	mu.Unlock()

	r = runGoLoad(context.Background(), loadSpec{
		Addr: addr, HotKey: "hot", Conns: 4, Duration: time.Second, Rate: 500,
	})
	if r.S429 != r.Responses || r.Errors != 0 {
		t.Fatalf("paced hot: %+v", r)
	}
	if got := r.reqPerSec(); got < 400 || got > 600 {
		t.Errorf("paced at 500 req/s, got %.0f", got)
	}
	if r.Sched.total != r.Responses {
		t.Errorf("paced: want a from-schedule latency per response")
	}
}
