package slidingratelimit

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
	deadAddr := freeAddr(t)
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
	tester := caddytest.NewTester(t)
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

// freeAddr returns a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestNearLimit(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "10", WarnAt: 0.8, Window: caddy.Duration(time.Minute)}
	logs := provision(t, h, newTestClock())
	counter := metrics.nearLimit.WithLabelValues(h.Name)
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

func TestDryRun(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "5", DryRun: true, Window: caddy.Duration(time.Minute)}
	logs := provision(t, h, newTestClock())
	for i := 0; i < 20; i++ {
		w := serve(t, h, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("dry run request %d: status %d", i+1, w.Code)
		}
		if w.Header().Get("Retry-After") != "" || w.Header().Get("RateLimit") != "" {
			t.Fatalf("dry run sent rate limit headers: %v", w.Header())
		}
	}
	if got := testutil.ToFloat64(metrics.requests.WithLabelValues(h.Name, resultDryRunDenied)); got != 15 {
		t.Errorf("dry-run denials %v, want 15", got)
	}
	if got := testutil.ToFloat64(metrics.requests.WithLabelValues(h.Name, resultAllowed)); got != 5 {
		t.Errorf("allowed %v, want 5", got)
	}
	if n := h.usage(t, "", ""); n != 5 {
		t.Errorf("store count %d, want 5: would-be denials must not be recorded", n)
	}
	if len(logs.FilterMessage("dry run: request would have been rate limited").All()) != 1 {
		t.Error("want one (rate-limited) dry-run log line")
	}
}

// TestAdminAPI: GET shows count 5 after 5 requests; DELETE resets; the next
// 5 are admitted.
func TestAdminAPI(t *testing.T) {
	name := uniqueName()
	tester := caddytest.NewTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	sliding_ratelimit {
		name   `+name+`
		key    {http.request.header.X-API-Key}
		region {http.request.header.X-Region}
		limit  5
		window 1m
	}
	respond "ok"
}
`, "caddyfile")
	hdr := map[string]string{"X-API-Key": "cust-42", "X-Region": "us"}
	admitted := func(n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			if get(t, tester, "http://localhost:9080/", hdr).StatusCode == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := admitted(6); got != 5 {
		t.Fatalf("%d admitted of 6, want 5", got)
	}
	url := "http://localhost:2999/sliding_ratelimit/" + name + "?key=cust-42&region=us"
	var u usageInfo
	resp := get(t, tester, url, nil)
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	if w := u.Windows[0]; w.Count != 5 || w.Remaining != 0 || w.Limit != 5 || u.RetryAfter < 1 || u.Allowed {
		t.Fatalf("usage %+v, want count 5, remaining 0, a retry time", u)
	}
	// GET consumed nothing.
	resp = get(t, tester, url, nil)
	json.NewDecoder(resp.Body).Decode(&u)
	if u.Windows[0].Count != 5 {
		t.Fatalf("second GET: count %d", u.Windows[0].Count)
	}

	req, _ := http.NewRequest(http.MethodDelete, url, nil)
	req.Header.Set("Origin", "http://localhost:2999")
	dresp, err := tester.Client.Do(req)
	if err != nil || dresp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %v %v", dresp.Status, err)
	}
	dresp.Body.Close()
	if got := admitted(6); got != 5 {
		t.Fatalf("after reset: %d admitted of 6, want 5", got)
	}

	resp = get(t, tester, "http://localhost:2999/sliding_ratelimit/", nil)
	var list []limiterInfo
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		found = found || (l.Name == name && len(l.Windows) == 1 && l.Windows[0].Limit == "5" && l.Store == "memory")
	}
	if !found {
		t.Errorf("limiter list %+v does not show %s", list, name)
	}
	if resp := get(t, tester, "http://localhost:2999/sliding_ratelimit/nope?key=x", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown limiter: status %d, want 404", resp.StatusCode)
	}
}

// TestOnLimitError: with on_limit error, handle_errors renders the denial:
// its own body, status 429, and Retry-After still set.
func TestOnLimitError(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	sliding_ratelimit {
		name     `+uniqueName()+`
		limit    1
		window   1m
		on_limit error
	}
	respond "ok"
	handle_errors 429 {
		respond "slow down, retry in {http.sliding_ratelimit.retry_after}s" 429
	}
}
`, "caddyfile")
	get(t, tester, "http://localhost:9080/", nil)
	resp := get(t, tester, "http://localhost:9080/", nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if string(body) != "slow down, retry in 60s" {
		t.Errorf("body %q, want the handle_errors page", body)
	}
	if resp.Header.Get("Retry-After") != "60" {
		t.Errorf("Retry-After %q, want 60", resp.Header.Get("Retry-After"))
	}
}
