package slidingratelimit

// Redis Cluster behind the handler: the global ceiling across regions on a
// cluster, and a slot migrated while requests flow.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestClusterHandlerGlobalCeiling is the per-region + global ceiling
// case (region 5, global 7) through the handler on a real 3-master Redis
// Cluster, for every algorithm: 5 admitted in us, 2 in gb, then gb is
// denied by the ceiling and us's count is unchanged. With fail closed, a
// CROSSSLOT (or any other Redis error) would show as a 503.
func TestClusterHandlerGlobalCeiling(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	for _, alg := range allAlgorithms(t) {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			h := &Handler{Name: uniqueName(), Algorithm: alg, Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
				Limit: "5", GlobalLimit: "7", Window: caddy.Duration(time.Minute), Fail: "closed",
				Redis: &RedisConfig{Addresses: cluster.Addrs(), Timeout: caddy.Duration(2 * time.Second)}}
			logs := provision(t, h, newTestClock()) // frozen clock: every algorithm counts alike
			us := map[string]string{"X-API-Key": "gold-1", "X-Region": "us"}
			gb := map[string]string{"X-API-Key": "gold-1", "X-Region": "gb"}
			for i := range 5 {
				o := mustServe(t, h, us)
				if o.code != http.StatusOK || o.source != "redis" {
					t.Fatalf("us %d: status %d source %q, want 200 from redis\n%s", i+1, o.code, o.source, renderLogs(logs))
				}
			}
			expectOutcome(t, "us 6th", mustServe(t, h, us), http.StatusTooManyRequests, "redis")
			for i := range 2 {
				expectOutcome(t, fmt.Sprintf("gb %d", i+1), mustServe(t, h, gb), http.StatusOK, "redis")
			}
			o := mustServe(t, h, gb)
			expectOutcome(t, "gb 3rd (global ceiling)", o, http.StatusTooManyRequests, "redis")
			if gc, _ := o.repl.GetString(phGlobalCount); gc != "7" {
				t.Errorf("global count placeholder %q, want 7", gc)
			}
			if n := h.usage(t, "gold-1", "gb"); n != 2 {
				t.Errorf("gb count %d, want 2 (denials are not recorded)", n)
			}
			if n := h.usage(t, "gold-1", "us"); n != 5 {
				t.Errorf("us count %d, want 5 (unchanged)", n)
			}
		})
	}
}

// TestClusterResharding moves an identity's slot to another master while
// the limiter uses it: during the migration the client follows ASK, after
// it MOVED, and the count carries on (state moved with the slot), with the
// handler's own client options (no retries).
func TestClusterResharding(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "10", GlobalLimit: "20", Window: caddy.Duration(time.Minute), Fail: "closed",
		Redis: &RedisConfig{Addresses: cluster.Addrs(), Timeout: caddy.Duration(2 * time.Second)}}
	logs := provision(t, h, newTestClock())
	const id = "mover"
	req := map[string]string{"X-API-Key": id, "X-Region": "eu"}
	n := 0
	step := func(what string) {
		t.Helper()
		n++
		o := mustServe(t, h, req)
		if o.code != http.StatusOK || o.source != "redis" {
			t.Fatalf("%s: status %d source %q, want 200 from redis\n%s", what, o.code, o.source, renderLogs(logs))
		}
		if got, want := o.header.Get("X-RateLimit-Remaining"), strconv.Itoa(10-n); got != want {
			t.Fatalf("%s: remaining %s, want %s: the count did not follow the slot", what, got, want)
		}
	}
	for range 3 {
		step("before the migration")
	}

	s0 := cluster.Servers[0]
	slot := s0.CLI(t, "CLUSTER", "KEYSLOT", id)
	ids := make([]string, len(cluster.Servers))
	var src, dst *redistest.Server
	var srcID, dstID string
	for i, s := range cluster.Servers {
		ids[i] = s.CLI(t, "CLUSTER", "MYID")
		if s.CLI(t, "CLUSTER", "COUNTKEYSINSLOT", slot) != "0" {
			src, srcID = s, ids[i]
		}
	}
	if src == nil {
		t.Fatalf("no master holds keys in slot %s", slot)
	}
	for i, s := range cluster.Servers {
		if s != src {
			dst, dstID = s, ids[i]
			break
		}
	}
	if got := dst.CLI(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID); got != "OK" {
		t.Fatalf("SETSLOT IMPORTING: %s", got)
	}
	if got := src.CLI(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID); got != "OK" {
		t.Fatalf("SETSLOT MIGRATING: %s", got)
	}
	step("slot migrating, keys still on the source")

	keys := strings.Fields(src.CLI(t, "CLUSTER", "GETKEYSINSLOT", slot, "100"))
	if len(keys) != 2 {
		t.Fatalf("keys in slot %s: %q, want the bucket and the ceiling", slot, keys)
	}
	args := append([]string{"MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port), "", "0", "5000", "KEYS"}, keys...)
	if got := src.CLI(t, args...); got != "OK" {
		t.Fatalf("MIGRATE: %s", got)
	}
	step("slot migrating, keys on the target (ASK)")

	for _, s := range []*redistest.Server{dst, src} {
		if got := s.CLI(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID); got != "OK" {
			t.Fatalf("SETSLOT NODE on %s: %s", s.Addr(), got)
		}
	}
	for _, s := range cluster.Servers {
		if s != src && s != dst {
			s.CLI(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		}
	}
	step("slot moved (MOVED)")
	step("slot moved, client's map updated")
	if got := dst.CLI(t, "CLUSTER", "COUNTKEYSINSLOT", slot); got != "2" {
		t.Errorf("target holds %s keys of slot %s, want 2", got, slot)
	}
}
