package slidingratelimit

import (
	"crypto/sha1"
	"encoding/hex"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// scriptSHA is the EVALSHA digest of the decision script.
func scriptSHA(t *testing.T, _ *redistest.Server) string {
	t.Helper()
	sum := sha1.Sum([]byte(lua.Decide))
	return hex.EncodeToString(sum[:])
}

// The values of {http.sliding_ratelimit.source}.
const (
	sourceFailOpen   = string(limiter.SourceFailOpen)
	sourceFailClosed = string(limiter.SourceFailClosed)
	sourceLocal      = string(limiter.SourceLocal)
	sourceDenyCache  = string(limiter.SourceDenyCache)
)

// The placeholders' full names.
const (
	phAllowed         = "http.sliding_ratelimit.allowed"
	phCount           = "http.sliding_ratelimit.count"
	phLimit           = "http.sliding_ratelimit.limit"
	phRemaining       = "http.sliding_ratelimit.remaining"
	phRetryAfter      = "http.sliding_ratelimit.retry_after"
	phRegion          = "http.sliding_ratelimit.region"
	phSource          = "http.sliding_ratelimit.source"
	phNearLimit       = "http.sliding_ratelimit.near_limit"
	phDryRun          = "http.sliding_ratelimit.dry_run"
	phGlobalCount     = "http.sliding_ratelimit.global_count"
	phGlobalLimit     = "http.sliding_ratelimit.global_limit"
	phGlobalRemaining = "http.sliding_ratelimit.global_remaining"
)

// unavailableBody is the 503 body of fail closed.
var unavailableBody = []byte(`{"error":"rate_limiter_unavailable"}` + "\n")

// circuitGauge reads a limiter's circuit_state as a scrape would.
func circuitGauge(t *testing.T, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "caddy_sliding_ratelimit_circuit_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" && l.GetValue() == name {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no circuit_state for limiter %s", name)
	return 0
}

// newBlackHole listens on loopback, accepts connections and never answers,
// like a Redis that hangs. It is closed at the end of the test.
func newBlackHole(t *testing.T) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), nil
}

// TestMain removes what the tests built outside their t.TempDir()s.
func TestMain(m *testing.M) {
	code := m.Run()
	if caddyBuild.dir != "" {
		os.RemoveAll(caddyBuild.dir)
	}
	os.Exit(code)
}
