package slidingratelimit

// Metrics, as Prometheus scrapes them from Caddy's admin endpoint.

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

const opsGlobal = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
	metrics
}
`

// scrape reads the admin endpoint's /metrics and returns the samples of
// caddy_sliding_ratelimit_* whose labels contain every given label.
func scrape(t *testing.T, tester *caddytest.Tester, metric string, labels ...string) float64 {
	t.Helper()
	resp, err := tester.Client.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return -1
	}
	return sum
}

func get(t *testing.T, tester *caddytest.Tester, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

// TestMetricsScrape: after allowed, denied and fail-open traffic, /metrics
// on the admin endpoint shows the right counts; after a reload the metrics
// keep counting.
func TestMetricsScrape(t *testing.T) {
	mem, dead := uniqueName(), uniqueName()
	// A port nobody listens on: connection refused at once.
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := "127.0.0.1:" + strconv.Itoa(port)
	config := func(limit int) string {
		return opsGlobal + `
http://localhost:9080 {
	route /mem {
		sliding_ratelimit {
			name   ` + mem + `
			limit  ` + strconv.Itoa(limit) + `
			window 1m
		}
		respond "ok"
	}
	route /dead {
		sliding_ratelimit {
			name   ` + dead + `
			limit  5
			window 1m
			redis  redis://` + deadAddr + `
		}
		respond "ok"
	}
}
`
	}
	tester := newTester(t)
	tester.InitServer(config(3), "caddyfile")
	for i := 0; i < 5; i++ {
		get(t, tester, "http://localhost:9080/mem", nil)
	}
	for i := 0; i < 2; i++ {
		if resp := get(t, tester, "http://localhost:9080/dead", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("fail open: status %d", resp.StatusCode)
		}
	}
	const reqs = "caddy_sliding_ratelimit_requests_total"
	check := func(name, result string, want float64) {
		t.Helper()
		if got := scrape(t, tester, reqs, `limiter="`+name+`"`, `result="`+result+`"`); got != want {
			t.Errorf("%s{limiter=%s,result=%s} = %v, want %v", reqs, name, result, got, want)
		}
	}
	check(mem, "allowed", 3)
	check(mem, "denied", 2)
	check(dead, "fail_open", 2)
	if got := scrape(t, tester, "caddy_sliding_ratelimit_store_errors_total", `limiter="`+dead+`"`); got != 2 {
		t.Errorf("store errors for %s: %v, want 2", dead, got)
	}
	if got := scrape(t, tester, "caddy_sliding_ratelimit_store_check_duration_seconds_count", `limiter="`+mem+`"`); got != 5 {
		t.Errorf("check duration count: %v, want 5", got)
	}

	// Reload with a changed limit: the in-process state and the metrics
	// carry on (3 of 6 used; 3 more admitted, then denied).
	tester.InitServer(config(6), "caddyfile")
	for i := 0; i < 4; i++ {
		get(t, tester, "http://localhost:9080/mem", nil)
	}
	check(mem, "allowed", 6)
	check(mem, "denied", 3)
}

func TestNearLimit(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "10", WarnAt: 0.8, Window: caddy.Duration(time.Minute)}
	logs := provision(t, h, newTestClock())
	counter := metrics.NearLimit.WithLabelValues(h.Name)
	for i := 1; i <= 10; i++ {
		w := serve(t, h, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		want := 0.0
		if i >= 8 {
			want = 1 // the 8th crosses 80%; the 9th and 10th are past it
		}
		if got := testutil.ToFloat64(counter); got != want {
			t.Fatalf("after request %d: near_limit_total %v, want %v", i, got, want)
		}
	}
	warns := logs.FilterMessage("client near its rate limit").All()
	if len(warns) != 1 {
		t.Fatalf("%d near-limit warnings, want 1", len(warns))
	}
	if _, ok := warns[0].ContextMap()["key"]; ok {
		t.Error("the key was logged without log_key")
	}
}

// TestCircuitGaugeAtScrape: two limiters share a Redis; both see it fail,
// only one serves requests after it recovers. A scrape shows both circuits
// closed, and every store error kind exists (at zero) from the start.
func TestCircuitGaugeAtScrape(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	mk := func() *Handler {
		h := &Handler{Name: uniqueName(), Limit: "100", Window: caddy.Duration(time.Minute),
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(50 * time.Millisecond), PoolSize: 7}}
		provision(t, h, nil)
		return h
	}
	busy, idle := mk(), mk()
	if errs := gather(t, "caddy_sliding_ratelimit_store_errors_total", idle.Name); len(errs) < 6 {
		t.Errorf("store_errors_total of a new limiter: %v, want every kind at 0", errs)
	}
	srv.Kill()
	for i := 0; i < 10; i++ {
		serve(t, busy, nil)
		serve(t, idle, nil)
	}
	if g := gather(t, "caddy_sliding_ratelimit_circuit_state", idle.Name); len(g) != 1 || g[0] != 1 {
		t.Fatalf("circuit_state during the outage: %v, want open (1)", g)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w, r, repl := newRequest(nil)
		_ = busy.ServeHTTP(w, r, nextOK)
		if src, _ := repl.GetString(phSource); src == "redis" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis did not come back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := gather(t, "caddy_sliding_ratelimit_circuit_state", idle.Name); len(g) != 1 || g[0] != 0 {
		t.Errorf("circuit_state of the idle limiter after Redis recovered: %v, want closed (0)", g)
	}
}

// scrapeFamilies scrapes the plugin's metrics as Prometheus would.
func scrapeFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// gather scrapes the plugin's metrics as Prometheus would and returns the
// values of metric for one limiter.
func gather(t *testing.T, metric, name string) []float64 {
	t.Helper()
	mfs := scrapeFamilies(t)
	var out []float64
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" && l.GetValue() == name {
					switch {
					case m.GetGauge() != nil:
						out = append(out, m.GetGauge().GetValue())
					case m.GetCounter() != nil:
						out = append(out, m.GetCounter().GetValue())
					}
				}
			}
		}
	}
	return out
}
