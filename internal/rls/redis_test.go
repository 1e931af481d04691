package rls_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestTwoInstancesOneRedisExact: two service instances on one
// redis-server, one clock (clock: app, moved by the test), every
// algorithm-exact rule: at each step, both instances together admit
// exactly what the sliding window has room for — no over-admission, no
// under-admission — counted by the test's own ledger of admissions.
func TestTwoInstancesOneRedisExact(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	const limit, window = 10, time.Minute
	config := fmt.Sprintf(`
domain: exact
clock: app
redis: {addresses: [%s], timeout: 5s}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: %d}
`, redis.Addr(), limit)
	clk := newClock()
	start := clk.Now()
	a, b := serve(t, config, clk), serve(t, config, clk)
	var admitted []time.Time // the ledger: the clock of every admission
	step := 3 * window / 10  // never a multiple of the window: no step sits on another's boundary
	for s := range 12 {
		now := clk.Now()
		inWindow := 0
		for _, at := range admitted {
			if now.Sub(at) < window {
				inWindow++
			}
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		got := 0
		var errs []error
		for i := range 2 * limit {
			c := a
			if i%2 == 1 {
				c = b
			}
			wg.Go(func() { // no t.Fatal here: off the test's goroutine
				resp, err := c.ShouldRateLimit(t.Context(), &pb.RateLimitRequest{Domain: "exact", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "u")}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if resp.OverallCode == ok {
					got++
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("step %d: %d checks failed: %v", s, len(errs), errs[0])
		}
		if want := limit - inWindow; got != want {
			t.Fatalf("step %d (t+%v): %d admitted across two instances, want %d (the limit %d less %d in the window)",
				s, now.Sub(start), got, want, limit, inWindow)
		}
		for range got {
			admitted = append(admitted, now)
		}
		clk.Add(step)
	}
	// Every sliding window of the ledger holds at most the limit.
	for i, at := range admitted {
		n := 0
		for _, o := range admitted[:i+1] {
			if at.Sub(o) < window {
				n++
			}
		}
		if n > limit {
			t.Fatalf("over-admission: %d admissions in the window ending %v, limit %d", n, at.Sub(start), limit)
		}
	}
}

// TestFailModesWithRedisStopped: with redis-server killed, fail open
// answers OK without a limit, fail closed OVER_LIMIT, fail local decides
// in this process (its limit holds).
func TestFailModesWithRedisStopped(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	clients := map[string]pb.RateLimitServiceClient{}
	for _, fail := range []string{"open", "closed", "local"} {
		clients[fail] = serve(t, fmt.Sprintf(`
domain: f
fail: %s
redis: {addresses: [%s], timeout: 200ms}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`, fail, redis.Addr()), nil)
	}
	for fail, c := range clients {
		if code, st := one(t, c, "f", desc("user", fail)); code != ok || st.LimitRemaining != 1 {
			t.Fatalf("fail %s, Redis up: %v %v", fail, code, st)
		}
	}
	redis.Kill()
	if code, st := one(t, clients["open"], "f", desc("user", "open")); code != ok || st.CurrentLimit != nil {
		t.Errorf("fail open, Redis down: %v %v, want OK without a limit", code, st)
	}
	resp := check(t, clients["closed"], &pb.RateLimitRequest{Domain: "f", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "closed")}})
	if resp.OverallCode != over || header(resp, "retry-after") != "1" {
		t.Errorf("fail closed, Redis down: %v, want OVER_LIMIT, Retry-After 1", resp)
	}
	var codes []pb.RateLimitResponse_Code
	for range 3 {
		code, _ := one(t, clients["local"], "f", desc("user", "local"))
		codes = append(codes, code)
	}
	if codes[0] != ok || codes[1] != ok || codes[2] != over {
		t.Errorf("fail local, Redis down: %v, want the in-process store's OK, OK, OVER_LIMIT", codes)
	}
}

// TestRedisTLSACLCluster: the redis block of the YAML reaches
// internal/redisconf: over TLS (the CA, a client certificate), as an ACL
// user limited to the limiter's keys, and on a Redis Cluster of 3, the
// limit holds (2 OK, then OVER_LIMIT), and a wrong password is Redis
// down (fail closed: OVER_LIMIT from the first check).
func TestRedisTLSACLCluster(t *testing.T) {
	t.Parallel()
	certs := redistest.NewCerts(t)
	tlsSrv := redistest.StartTLS(t, certs, "--tls-auth-clients", "yes")
	aclSrv := redistest.Start(t)
	if got := aclSrv.CLI(t, "ACL", "SETUSER", "rls", "on", ">s3cret", "~ratelimit:*", "&ratelimit:*", "+@all"); got != "OK" {
		t.Fatalf("ACL SETUSER: %s", got)
	}
	if got := aclSrv.CLI(t, "ACL", "SETUSER", "default", "off"); got != "OK" { // only rls can work now
		t.Fatalf("ACL SETUSER default off: %s", got)
	}
	cluster := redistest.StartCluster(t, 3)
	rule := "descriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 2}}]\n"
	for name, redis := range map[string]string{
		"tls":     fmt.Sprintf("{addresses: [%s], tls: {ca: %s, cert: %s, key: %s}, timeout: 5s}", tlsSrv.Addr(), certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile),
		"acl":     fmt.Sprintf("{url: 'redis://rls:s3cret@%s', timeout: 5s}", aclSrv.Addr()),
		"cluster": fmt.Sprintf("{addresses: [%s], timeout: 5s}", strings.Join(cluster.Addrs(), ", ")),
	} {
		c := serve(t, "domain: r\nfail: closed\nredis: "+redis+"\n"+rule, nil)
		for i := 1; i <= 3; i++ {
			if code, _ := one(t, c, "r", desc("user", name)); (code == over) != (i == 3) {
				t.Fatalf("%s, check %d: %v", name, i, code)
			}
		}
	}
	c := serve(t, fmt.Sprintf("domain: r\nfail: closed\nredis: {url: 'redis://rls:wrong@%s', timeout: 1s}\n%s", aclSrv.Addr(), rule), nil)
	if code, st := one(t, c, "r", desc("user", "x")); code != over || st.CurrentLimit != nil && st.LimitRemaining != 0 {
		t.Fatalf("wrong password, fail closed: %v %v", code, st)
	}
}

// TestGlobalCeilingAcrossDatacenters: two services, each on its own
// data centre's redis-server, one ledger (global_redis): the global
// ceiling of 6 a minute per tenant holds across them, however the 30
// checks split (each region's own limit is 100), and some are admitted.
func TestGlobalCeilingAcrossDatacenters(t *testing.T) {
	t.Parallel()
	ledger := redistest.Start(t)
	var clients []pb.RateLimitServiceClient
	for _, dc := range []string{"eu", "us"} {
		own := redistest.Start(t)
		clients = append(clients, serve(t, fmt.Sprintf(`
domain: g
redis: {addresses: [%s], timeout: 2s}
global_redis: {addresses: [%s], timeout: 2s}
datacenter: %s
descriptors:
  - key: tenant
    descriptors:
      - key: dc
        rate_limit:
          region_key: dc
          unit: minute
          requests_per_unit: 100
          global: [{requests_per_unit: 6, unit: minute}]
`, own.Addr(), ledger.Addr(), dc), nil))
	}
	admitted := 0
	for i := range 30 {
		dc := []string{"eu", "us"}[i%2]
		if code, _ := one(t, clients[i%2], "g", desc("tenant", "t", "dc", dc)); code == ok {
			admitted++
		}
	}
	if admitted > 6 || admitted == 0 {
		t.Fatalf("%d of 30 admitted across two data centres under a ceiling of 6", admitted)
	}
	t.Logf("%d of 30 admitted under a ceiling of 6", admitted)
}
