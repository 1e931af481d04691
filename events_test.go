package slidingratelimit

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// recorded holds the events seen by eventRecorder.
var recorded struct {
	sync.Mutex
	events []caddy.Event
}

// eventRecorder is a test-only events handler that records what it gets.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.sliding_ratelimit_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recorded.Lock()
	recorded.events = append(recorded.events, e)
	recorded.Unlock()
	return nil
}

// TestExceededEvent: with an events app subscribed, a burst of denials
// emits one sliding_ratelimit_exceeded event (rate-limited), naming the
// limiter and region, without the key unless log_key is set.
func TestExceededEvent(t *testing.T) {
	name := uniqueName()
	tester := newTester(t)
	tester.InitServer(`{
		"admin": {"listen": "localhost:2999"},
		"apps": {
			"events": {"subscriptions": [{
				"events": ["sliding_ratelimit_exceeded"],
				"handlers": [{"handler": "sliding_ratelimit_test_recorder"}]
			}]},
			"http": {"http_port": 9080, "servers": {"srv0": {
				"listen": [":9080"],
				"routes": [{"handle": [
					{"handler": "sliding_ratelimit", "name": "`+name+`", "key": "{http.request.header.X-API-Key}",
					 "region": "{http.request.header.X-Region}", "limit": 1, "window": "1m"},
					{"handler": "static_response", "body": "ok"}
				]}]
			}}}
		}
	}`, "json")
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
		req.Header.Set("X-API-Key", "secret-key-1")
		req.Header.Set("X-Region", "pl")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	recorded.Lock()
	defer recorded.Unlock()
	var mine []caddy.Event
	for _, e := range recorded.events {
		if e.Name() == eventExceeded && e.Data["limiter"] == name {
			mine = append(mine, e)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("%d %s events for 5 denials in one burst, want 1", len(mine), eventExceeded)
	}
	d := mine[0].Data
	if d["region"] != "pl" || d["retry_after"] != int64(60) || d["limit"] != int64(1) {
		t.Errorf("event data %v", d)
	}
	if _, ok := d["key"]; ok {
		t.Error("event carries the key without log_key")
	}
}

// TestBannedEvent: a key put in the penalty box emits one
// sliding_ratelimit_banned event, and counts in bans_total.
func TestBannedEvent(t *testing.T) {
	name := uniqueName()
	tester := newTester(t)
	tester.InitServer(`{
		"admin": {"listen": "localhost:2999"},
		"apps": {
			"events": {"subscriptions": [{
				"events": ["sliding_ratelimit_banned"],
				"handlers": [{"handler": "sliding_ratelimit_test_recorder"}]
			}]},
			"http": {"http_port": 9080, "servers": {"srv0": {
				"listen": [":9080"],
				"routes": [{"handle": [
					{"handler": "sliding_ratelimit", "name": "`+name+`", "key": "{http.request.header.X-API-Key}",
					 "limit": 1, "window": "1m", "ban": {"for": "1h", "after": 3, "within": "1m"}},
					{"handler": "static_response", "body": "ok"}
				]}]
			}}}
		}
	}`, "json")
	codes := []int{}
	for i := 0; i < 8; i++ {
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
		req.Header.Set("X-API-Key", "abuser")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	recorded.Lock()
	var mine []caddy.Event
	for _, e := range recorded.events {
		if e.Name() == eventBanned && e.Data["limiter"] == name {
			mine = append(mine, e)
		}
	}
	recorded.Unlock()
	if len(mine) != 1 {
		t.Fatalf("%d %s events (statuses %v), want 1", len(mine), eventBanned, codes)
	}
	if left, _ := mine[0].Data["ban_left"].(int64); left < 3590 || left > 3600 {
		t.Errorf("event data %v: ban_left %v, want about an hour", mine[0].Data, mine[0].Data["ban_left"])
	}
	if got := gather(t, "caddy_sliding_ratelimit_bans_total", name); len(got) != 1 || got[0] != 1 {
		t.Errorf("bans_total %v, want 1", got)
	}
}
