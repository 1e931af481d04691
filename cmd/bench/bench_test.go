package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
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

// TestRedisFigures: a run's Redis figures come from the shared INFO
// helpers (EVALSHA + EVAL of INFO commandstats, INFO cpu), and the trivial
// EVAL baseline counts its own calls.
func TestRedisFigures(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	before := snap(ctx, os.Getpid(), c)
	triv, err := trivialEval(ctx, c, 1000, 50)
	if err != nil {
		t.Fatal(err)
	}
	if triv.Calls != 1000 || triv.UsecPerCall <= 0 || triv.Pipeline != 50 {
		t.Errorf("trivial baseline %+v", triv)
	}
	if err := c.Eval(ctx, "return redis.call('incr', KEYS[1])", []string{"k"}).Err(); err != nil {
		t.Fatal(err)
	}
	after := snap(ctx, os.Getpid(), c)
	var smp sample
	smp.fill(before, after)
	if !smp.RedisOK || smp.Scripts.Calls != 1001 || smp.RedisCPU < 0 || smp.CaddyCPU < 0 {
		t.Errorf("sample %+v", smp)
	}
	// No Redis: only the process's CPU time.
	if s := snap(ctx, os.Getpid(), nil); s.redisOK || !s.caddyOK {
		t.Errorf("snapshot without Redis: %+v", s)
	}
}

func TestCPUList(t *testing.T) {
	got, err := parseCPUList("0-2,8, 5,1")
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 5, 8}) || cpuList(got) != "0,1,2,5,8" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "a", "3-1", "1-x"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if cpus, err := allowedCPUs(os.Getpid()); err != nil || len(cpus) == 0 {
		t.Errorf("allowedCPUs(self) = %v, %v", cpus, err)
	}
}

func TestSelectLayouts(t *testing.T) {
	ls, note, err := selectLayouts("shared")
	if err != nil || len(ls) != 1 || ls[0].pinned() || note != "" {
		t.Fatalf("shared: %v %q %v", ls, note, err)
	}
	if _, _, err := selectLayouts("sideways"); err == nil {
		t.Fatal("unknown layout: want an error")
	}
	ls, note, err = selectLayouts("all")
	if err != nil {
		t.Fatal(err)
	}
	if _, perr := pinnedLayout(); perr != nil {
		// One CPU or no taskset: the pinned layout falls back, saying why.
		if len(ls) != 1 || !strings.Contains(note, "pinned layout unavailable") {
			t.Fatalf("no pinning: %v %q", ls, note)
		}
	} else if len(ls) != 2 || !ls[1].pinned() || ls[1].CaddyCPU == ls[1].LoadCPU || note != "" {
		t.Fatalf("all: %v %q", ls, note)
	}
	p := layout{Name: "pinned", CaddyCPU: 0, LoadCPU: 1}
	if d := p.describe(2); !strings.Contains(d, "GOMAXPROCS=1") || !strings.Contains(d, "taskset -c 1") {
		t.Errorf("describe: %s", d)
	}
	if w := wrap(1); !slices.Equal(w, []string{"taskset", "-c", "1"}) || wrap(-1) != nil {
		t.Errorf("wrap: %v", w)
	}
}

func TestSpreadAndSummary(t *testing.T) {
	sp, ok := spreadOf([]float64{0.5, 0.7, math.NaN(), 0.6, 0.4})
	if !ok || sp.N != 4 || sp.Median != 0.55 || sp.Min != 0.4 || sp.Max != 0.7 || math.Abs(sp.Q1-0.475) > 1e-9 {
		t.Fatalf("spread %+v", sp)
	}
	if _, ok := spreadOf([]float64{math.NaN()}); ok {
		t.Fatal("no valid value: want !ok")
	}
	mk := func(rps float64, resp uint64, cpu time.Duration, calls int64) sample {
		return sample{
			measurement: measurement{Generator: "go", ReqPerSec: rps, Responses: resp, S2xx: resp, P50: time.Millisecond, P99: 2 * time.Millisecond},
			CaddyCPU:    cpu, RedisOK: true, RedisCPU: cpu / 2, Scripts: redistest.CommandStat{Calls: calls, Usec: calls * 10},
		}
	}
	pairs := []pair{
		{Site: mk(500, 1000, 30*time.Millisecond, 500), Bare: mk(1000, 2000, 40*time.Millisecond, 0)},
		{Site: mk(600, 1000, 30*time.Millisecond, 500), Bare: mk(1000, 2000, 40*time.Millisecond, 0), SiteFirst: true},
		{Site: mk(700, 1000, 30*time.Millisecond, 500), Bare: mk(0, 0, 0, 0)}, // a bare run that failed
	}
	sm := summarize(pairs)
	if !sm.RatioOK || sm.Ratio.N != 2 || sm.Ratio.Median != 0.55 || sm.ReqPerSec != 600 || sm.Responses != 3000 {
		t.Fatalf("summary %+v", sm)
	}
	if sm.CaddyCPUPerReq != 30*time.Microsecond || sm.BareCaddyCPUPerReq != 20*time.Microsecond {
		t.Errorf("Caddy CPU/req %v, bare %v", sm.CaddyCPUPerReq, sm.BareCaddyCPUPerReq)
	}
	if v, _ := sm.callsPerReq(); v != 0.5 {
		t.Errorf("calls/req %v", v)
	}
	if v, _ := sm.redisCPUPerReq(); v != 15*time.Microsecond {
		t.Errorf("Redis CPU/req %v", v)
	}
	if v, _ := sm.redisCPUPerCall(); v != 30*time.Microsecond {
		t.Errorf("Redis CPU/call %v", v)
	}
	if v, _ := sm.scriptUsecPerCall(); v != 10 {
		t.Errorf("script µs/call %v", v)
	}
	rep := siteReportOf(siteResult{Site: siteByName("redis_log"), Pairs: pairs}, &trivial{UsecPerCall: 2.5})
	if v, _ := sm.scriptUsecPerReq(); v != 5 {
		t.Errorf("script µs/req %v", v)
	}
	if rep.XTrivial == nil || *rep.XTrivial != 2 || rep.PairRatios != nil || rep.Ratio == nil {
		t.Errorf("report %+v", rep)
	}
}

func TestParseBench(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/sliding-ratelimit/sliding_ratelimit
cpu: AMD EPYC
BenchmarkHandler/baseline-2         	    2000	      1825 ns/op	    1520 B/op	      20 allocs/op
BenchmarkHandler/redis/sliding_log/admitted-2         	    2000	     41234 ns/op	    2873 B/op	      32 allocs/op
BenchmarkHandler/memory/sliding_log/hot_denied        	    2000	       812.5 ns/op
--- FAIL: BenchmarkHandler/redis/token_bucket/admitted
    bench_test.go:53: sliding_ratelimit: bad limit
--- FAIL: BenchmarkHandler
FAIL
exit status 1
FAIL	github.com/sliding-ratelimit/sliding_ratelimit	3.1s
`
	bs := parseBench(out)
	if len(bs) != 4 {
		t.Fatalf("got %+v", bs)
	}
	if b := bs[1]; b.Name != "BenchmarkHandler/redis/sliding_log/admitted" || *b.NsPerOp != 41234 || *b.BytesPerOp != 2873 || *b.AllocsPerOp != 32 {
		t.Errorf("line 2: %+v", b)
	}
	if b := bs[2]; b.Name != "BenchmarkHandler/memory/sliding_log/hot_denied" || *b.NsPerOp != 812.5 || b.AllocsPerOp != nil {
		t.Errorf("line 3: %+v", b)
	}
	if b := bs[3]; b.Name != "BenchmarkHandler/redis/token_bucket/admitted" || b.Failed != "bench_test.go:53: sliding_ratelimit: bad limit" || b.NsPerOp != nil {
		t.Errorf("failed sub-benchmark: %+v", b)
	}
	// A run that cannot work reports n/a, it does not fail.
	if r := runMicro(context.Background(), "", "", "1x"); r.Err == "" {
		t.Errorf("no go: %+v", r)
	}
	var buf bytes.Buffer
	printReport(&buf, &report{Micro: &microResult{Command: "go test", Err: "build failed", Benches: bs}})
	if !strings.Contains(buf.String(), "allocs/op: n/a (build failed)") || !strings.Contains(buf.String(), "| 32 |") ||
		!strings.Contains(buf.String(), "| n/a (failed: bench_test.go:53: sliding_ratelimit: bad limit) |") {
		t.Errorf("report:\n%s", buf.String())
	}
}

func TestSelectSitesAndCaddyfile(t *testing.T) {
	ss, err := selectSites("redis_log, none", false)
	if err != nil || len(ss) != 2 || ss[0].Name != "none" || ss[1].Name != "redis_log" {
		t.Fatalf("got %v %v", ss, err)
	}
	if _, err := selectSites("none,nope", false); err == nil {
		t.Fatal("unknown site: want an error")
	}
	if ss, err := selectSites("all", false); err != nil || slices.ContainsFunc(ss, func(s site) bool { return s.Peer }) {
		t.Errorf("all without -peer: %v %v, want no peer site", ss, err)
	}
	if _, err := selectSites("none,peer_memory", false); err == nil || !strings.Contains(err.Error(), "-peer") {
		t.Errorf("the peer's site without -peer: %v, want an error naming -peer", err)
	}
	all, _ := selectSites("all", true)
	if !slices.ContainsFunc(all, func(s site) bool { return s.Name == "peer_memory" }) {
		t.Errorf("all with -peer lacks peer_memory")
	}
	ports := map[string]int{}
	for i, s := range all {
		ports[s.Name] = 20000 + i
	}
	cf := caddyfile(19999, all, ports, "redis://127.0.0.1:1234")
	for _, want := range []string{
		"admin 127.0.0.1:19999", "auto_https off", "http://127.0.0.1:20000 {", "bind 127.0.0.1",
		"redis redis://127.0.0.1:1234", "algorithm token_bucket", "algorithm fixed_window", "algorithm sliding_counter",
		"limit 100\n", "limit 10000\n", "deny_cache off", "pipeline off", `respond "ok" 200`,
		"\trate_limit {\n\t\tzone bench_peer {\n\t\tkey {http.request.header.X-Key}\n\t\tevents 100\n\t\twindow 1s\n\t\t}\n\t}\n",
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

	// A machine that stalls for the whole 300 ms (make test beside other
	// work: seen once) measures no response; the run is tried again then,
	// up to three times, so that only a generator that never gets one fails.
	measured := false
	var r loadResult
	for try := 0; try < 3 && (try == 0 || r.Responses == 0 && r.Errors == 0); try++ {
		measured = false
		r = runGoLoad(context.Background(), loadSpec{
			Addr: addr, Keys: 1000, Conns: 4, Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond,
			OnMeasure: func() { measured = true },
		})
	}
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

// TestWritePlot: the plot of a report is a PNG, and a report without a
// ratio is refused rather than drawn empty.
func TestWritePlot(t *testing.T) {
	rep := &report{Config: reportConfig{Pairs: 3}, Machine: machine{Date: "2026-12-01"}}
	for _, name := range []string{"pinned", "shared"} {
		l := layoutReport{Name: name}
		for i, site := range []string{"none", "memory_log", "peer_memory"} {
			v := 0.7 + 0.1*float64(i)
			l.Sites = append(l.Sites, siteReport{Site: site, Ratio: &spread{N: 3, Median: v, Min: v - 0.02, Max: v + 0.03}})
		}
		rep.Layouts = append(rep.Layouts, l)
	}
	path := filepath.Join(t.TempDir(), "bench.png")
	if err := writePlot(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 1000 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("plot: %d bytes, %v, want a PNG", len(b), err)
	}
	if err := writePlot(path, &report{}); err == nil {
		t.Error("a report without ratios: no error")
	}
	// -replot draws the same plot from the report's JSON (-json's output).
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	js, again := filepath.Join(t.TempDir(), "run.json"), filepath.Join(t.TempDir(), "again.png")
	if err := os.WriteFile(js, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := replot(js, again); err != nil {
		t.Fatal(err)
	}
	if b2, err := os.ReadFile(again); err != nil || !bytes.Equal(b2, b) {
		t.Errorf("-replot: %d bytes, %v; want the %d bytes writePlot drew from the report itself", len(b2), err, len(b))
	}
	if err := replot(js, ""); err == nil {
		t.Error("-replot without -plot: no error")
	}
}

func TestHarnesses(t *testing.T) {
	o := options{conns: 64, admin: true}
	hs, err := selectHarnesses("bench,outside", &o)
	if err != nil || len(hs) != 2 || hs[0].Name != "bench" || hs[0].Conns != 64 || !hs[0].Admin || hs[1] != outsideHarness {
		t.Fatalf("bench,outside: %+v %v", hs, err)
	}
	if o := outsideHarness; o.Conns != 32 || o.Admin || o.LogLevel != "ERROR" || o.Rate != "100/1s" || !o.PinnedOnly {
		t.Errorf("outside harness: %+v, want issue 29's (32 connections, admin off, ERROR, 100/1s, pinned)", o)
	}
	if _, err := selectHarnesses("inside", &o); err == nil {
		t.Error("unknown harness: want an error")
	}
	// The sweep: bench, then each of outside's choices alone on bench's, then outside.
	hs, err = selectHarnesses("sweep", &o)
	if err != nil || len(hs) != 5 {
		t.Fatalf("sweep: %+v %v", hs, err)
	}
	for i, want := range []harness{
		{Name: "bench", Conns: 64, Admin: true},
		{Name: "conns32", Conns: 32, Admin: true, PinnedOnly: true},
		{Name: "quiet", Conns: 64, LogLevel: "ERROR", PinnedOnly: true},
		{Name: "rate100", Conns: 64, Admin: true, Rate: "100/1s", PinnedOnly: true},
		outsideHarness,
	} {
		if hs[i] != want {
			t.Errorf("sweep[%d] = %+v, want %+v", i, hs[i], want)
		}
	}
	for _, bad := range []string{"100", "x/1s", "100/", "/1s", "100/1s }"} {
		if _, _, err := parseRate(bad); err == nil {
			t.Errorf("parseRate(%q): want an error", bad)
		}
	}

	all, _ := selectSites("all", true)
	ports := map[string]int{}
	for i, s := range all {
		ports[s.Name] = 20000 + i
	}
	cf := caddyfileFor(outsideHarness, 19999, all, ports, "redis://127.0.0.1:1234")
	for _, want := range []string{
		"\tadmin off\n", "\tlog {\n\t\tlevel ERROR\n\t}\n",
		// Our many-key sites at the peer's 100 a second, the peer's zone as it was.
		"name bench_memory_log\n\t\talgorithm sliding_log\n\t\tkey {http.request.header.X-Key}\n\t\tlimit 100\n\t\twindow 1s\n",
		"name bench_redis_counter\n\t\talgorithm sliding_counter\n\t\tkey {http.request.header.X-Key}\n\t\tlimit 100\n\t\twindow 1s\n",
		"zone bench_peer {\n\t\tkey {http.request.header.X-Key}\n\t\tevents 100\n\t\twindow 1s\n",
		// The hot key and the at-limit sites keep theirs.
		"name bench_hot_denied\n\t\talgorithm sliding_log\n\t\tkey {http.request.header.X-Key}\n\t\tlimit 10\n\t\twindow 1h\n",
		"name bench_redis_log_10000\n\t\talgorithm sliding_log\n\t\tkey {http.request.header.X-Key}\n\t\tlimit 10000\n\t\twindow 1m\n",
	} {
		if !strings.Contains(cf, want) {
			t.Errorf("outside Caddyfile lacks %q:\n%s", want, cf)
		}
	}
	if strings.Contains(cf, "admin 127.0.0.1") {
		t.Errorf("outside Caddyfile has an admin endpoint:\n%s", cf)
	}
	if bench := caddyfile(19999, all, ports, "redis://127.0.0.1:1234"); strings.Contains(bench, "admin off") || strings.Contains(bench, "level ERROR") ||
		!strings.Contains(bench, "name bench_memory_log\n\t\talgorithm sliding_log\n\t\tkey {http.request.header.X-Key}\n\t\tlimit 10000\n\t\twindow 1m\n") {
		t.Errorf("bench Caddyfile changed:\n%s", bench)
	}
}

func TestPrintHarnesses(t *testing.T) {
	ratio := func(m float64) *spread { return &spread{Median: m, Min: m - 0.01, Max: m + 0.01} }
	rep := &report{Layouts: []layoutReport{
		{Name: "pinned", Harness: "bench", Sites: []siteReport{{Site: "none", Ratio: ratio(1)}, {Site: "memory_log", Ratio: ratio(0.8)}}},
		{Name: "pinned", Harness: "outside", Sites: []siteReport{{Site: "none", Ratio: ratio(0.99)}, {Site: "memory_log", Ratio: ratio(0.77)}}},
	}}
	var b strings.Builder
	printHarnesses(&b, rep)
	for _, want := range []string{"| site | bench | outside |", "| memory_log | 0.80 (0.79–0.81) | 0.77 (0.76–0.78) |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printHarnesses(&b, &report{Layouts: rep.Layouts[:1]})
	if b.Len() != 0 {
		t.Errorf("one setting: want no table, got\n%s", b.String())
	}
}
