package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// e2eConfig is a real Caddy config: the handler runs in Caddy's chain.
func e2eConfig(extra string) string {
	return `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
}
http://localhost:9080 {
	sliding_ratelimit {
		name    e2e
		key     {http.request.header.X-API-Key}
		limit   5
		window  1m
		` + extra + `
	}
	respond "ok"
}
`
}

// sfItem parses a header as an HTTP structured-field list (RFC 9651) and
// returns its only member's string value and parameters.
func sfItem(t *testing.T, name, value string) (string, map[string]int64) {
	t.Helper()
	list, err := httpsfv.UnmarshalList([]string{value})
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", name, value, err)
	}
	if len(list) != 1 {
		t.Fatalf("%s: %q has %d members, want 1", name, value, len(list))
	}
	item, ok := list[0].(httpsfv.Item)
	if !ok {
		t.Fatalf("%s: %q: member is not an item", name, value)
	}
	s, ok := item.Value.(string)
	if !ok {
		t.Fatalf("%s: %q: policy name is not a string", name, value)
	}
	params := map[string]int64{}
	for _, k := range item.Params.Names() {
		v, _ := item.Params.Get(k)
		n, ok := v.(int64)
		if !ok {
			t.Fatalf("%s: %q: parameter %s is not an integer", name, value, k)
		}
		params[k] = n
	}
	return s, params
}

// TestEndToEnd sends real HTTP through Caddy: 5 requests admitted with
// X-RateLimit-Remaining 4..0, the 6th gets 429 with Retry-After, the JSON
// body and RateLimit/RateLimit-Policy headers that parse as structured
// fields. Once on the in-process store and once on a real redis-server.
func TestEndToEnd(t *testing.T) {
	srv := redistest.Start(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			extra := ""
			if store == "redis" {
				extra = "redis redis://" + srv.Addr()
			}
			tester := newTester(t)
			tester.InitServer(e2eConfig(extra), "caddyfile")
			key := randomKey(t)
			get := func() *http.Response {
				req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
				req.Header.Set("X-API-Key", key)
				resp, err := tester.Client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { resp.Body.Close() })
				return resp
			}
			for want := 4; want >= 0; want-- {
				resp := get()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d, want 200", resp.StatusCode)
				}
				if got := resp.Header.Get("X-RateLimit-Remaining"); got != strconv.Itoa(want) {
					t.Fatalf("X-RateLimit-Remaining %q, want %d", got, want)
				}
				name, p := sfItem(t, "RateLimit", resp.Header.Get("RateLimit"))
				if name != "e2e" || p["r"] != int64(want) {
					t.Fatalf("RateLimit %q: want policy e2e with r=%d", resp.Header.Get("RateLimit"), want)
				}
			}
			resp := get()
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("6th: status %d, want 429", resp.StatusCode)
			}
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 60 {
				t.Fatalf("Retry-After %q, want 1..60 seconds", resp.Header.Get("Retry-After"))
			}
			body, _ := io.ReadAll(resp.Body)
			var deny struct {
				Error      string `json:"error"`
				RetryAfter int    `json:"retry_after"`
			}
			if err := json.Unmarshal(body, &deny); err != nil || deny.Error != "rate_limited" || deny.RetryAfter != ra {
				t.Fatalf("429 body %q (err %v), want rate_limited with retry_after %d", body, err, ra)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			name, p := sfItem(t, "RateLimit-Policy", resp.Header.Get("RateLimit-Policy"))
			if name != "e2e" || p["q"] != 5 || p["w"] != 60 {
				t.Errorf("RateLimit-Policy %q, want \"e2e\";q=5;w=60", resp.Header.Get("RateLimit-Policy"))
			}
			name, p = sfItem(t, "RateLimit", resp.Header.Get("RateLimit"))
			if name != "e2e" || p["r"] != 0 || p["t"] != int64(ra) {
				t.Errorf("RateLimit %q, want r=0 and t=%d", resp.Header.Get("RateLimit"), ra)
			}
			if got := resp.Header.Get("X-RateLimit-Remaining"); got != "0" {
				t.Errorf("X-RateLimit-Remaining on 429: %q", got)
			}
		})
	}
}

func randomKey(t *testing.T) string {
	return fmt.Sprintf("key-%s-%d", t.Name(), nameSeq.Add(1))
}
