package slidingratelimit

// Sentinel: the client follows a failover.

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestSentinelFailover: the limiter finds the master through Sentinel; the
// master is killed; after Sentinel promotes the replica, decisions come
// from Redis again (source redis, not fail_open) with no restart.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t, 3)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "1000", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: sn.Addrs(), Sentinel: redistest.SentinelMaster, Timeout: caddy.Duration(time.Second)}}
	logs := provision(t, h, newTestClock())
	hdr := map[string]string{"X-API-Key": "k"}
	for i := range 3 {
		o := mustServe(t, h, hdr)
		if o.code != http.StatusOK || o.source != "redis" {
			t.Fatalf("request %d before the failover: status %d source %q\n%s", i+1, o.code, o.source, renderLogs(logs))
		}
	}

	old := sn.Master.Addr()
	sn.Master.Kill()
	killed := time.Now()
	const within = 15 * time.Second
	sources := map[string]int{}
	for {
		o := mustServe(t, h, hdr)
		sources[o.source]++
		if o.code != http.StatusOK {
			t.Fatalf("fail open during the failover: status %d (source %q)", o.code, o.source)
		}
		if o.source == "redis" && sources["fail_open"] > 0 {
			break
		}
		if time.Since(killed) > within {
			t.Fatalf("no decision from Redis %s after the master was killed (sources %v); Sentinel says the master is %s\n%s",
				within, sources, sn.MasterAddr(t), renderLogs(logs))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("decisions from redis again %s after the master was killed (sources meanwhile: %v)", time.Since(killed).Round(time.Millisecond), sources)
	if now := sn.MasterAddr(t); now != sn.Replica.Addr() || now == old {
		t.Errorf("Sentinel's master is %s, want the promoted replica %s", now, sn.Replica.Addr())
	}
	for i := range 5 {
		expectOutcome(t, fmt.Sprintf("request %d after the failover", i+1), mustServe(t, h, hdr), http.StatusOK, "redis")
	}
}
