package slidingratelimit

// Tests of issue 5, "Production Redis": Redis Cluster, Sentinel, TLS, ACL,
// an outage under load (fail open / fail local, the circuit breaker, the
// recovery) and a config reload under load. Every test starts its own
// redis-server processes on 127.0.0.1 (internal/redistest).

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// reqOutcome is one request through a handler, as seen by the client and by
// later handlers (the placeholders).
type reqOutcome struct {
	code   int
	source string // {http.sliding_ratelimit.source}
	header http.Header
	repl   *caddy.Replacer
	took   time.Duration
	err    error // ServeHTTP's error
}

// serveOutcome sends one request with the given headers through h (next answers
// 200). Unlike serve it never calls t.Fatal, so goroutines may use it.
func serveOutcome(h *Handler, hdr map[string]string) reqOutcome {
	w, r, repl := newRequest(hdr)
	start := time.Now()
	err := h.ServeHTTP(w, r, nextOK)
	o := reqOutcome{code: w.Code, header: w.Header(), repl: repl, took: time.Since(start), err: err}
	o.source, _ = repl.GetString(phSource)
	return o
}

// mustServe is serveOutcome for the test goroutine: a handler error fails the test.
func mustServe(t *testing.T, h *Handler, hdr map[string]string) reqOutcome {
	t.Helper()
	o := serveOutcome(h, hdr)
	if o.err != nil {
		t.Fatalf("ServeHTTP: %v", o.err)
	}
	return o
}

// expectOutcome checks status and source of one outcome.
func expectOutcome(t *testing.T, what string, o reqOutcome, code int, source string) {
	t.Helper()
	if o.code != code || o.source != source {
		t.Fatalf("%s: status %d, source %q; want %d from %q", what, o.code, o.source, code, source)
	}
}

// errorLogged returns the error field of the first logged line whose
// message or error holds want, and whether there is one.
func errorLogged(logs *observer.ObservedLogs, want string) (string, bool) {
	for _, e := range logs.All() {
		msg := fmt.Sprint(e.ContextMap()["error"])
		if strings.Contains(msg, want) || strings.Contains(e.Message, want) {
			return msg, true
		}
	}
	return "", false
}

// renderLogs renders the observed log lines for a failure message.
func renderLogs(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		fmt.Fprintf(&b, "  %s %s %v\n", e.Level, e.Message, e.ContextMap())
	}
	return b.String()
}

// allAlgorithms lists every algorithm the engine knows, so the tests cover
// the table however it grows.
func allAlgorithms(t *testing.T) []string {
	t.Helper()
	var names []string
	for a := limiter.Algorithm(0); ; a++ {
		if _, err := limiter.ParseAlgorithm(a.String()); err != nil {
			break
		}
		names = append(names, a.String())
	}
	if len(names) == 0 {
		t.Fatal("no algorithm")
	}
	return names
}

// redisBreaker returns the circuit breaker around h's Redis store (shared by
// every handler with the same Redis config).
func redisBreaker(t *testing.T, h *Handler) *limiter.Breaker {
	t.Helper()
	if h.breaker == nil {
		t.Fatal("handler has no circuit breaker")
	}
	return h.breaker
}

// ---- 1. Redis Cluster ---------------------------------------------------

// TestClusterHandlerGlobalCeiling is issue 4's per-region + global ceiling
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

// ---- 2. Sentinel --------------------------------------------------------

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

// ---- 3. TLS -------------------------------------------------------------

// TestTLS: redis-server with --tls-port and certificates made by the test.
// The limiter connects with `tls { ca ... }` (JSON, Caddyfile, rediss://
// URL) and decides; a wrong CA or the system roots fail with a clear x509
// error in the log and the fail mode; a server that wants a client
// certificate gets one from `cert`/`key`.
func TestTLS(t *testing.T) {
	t.Parallel()
	certs := redistest.NewCerts(t)
	srv := redistest.StartTLS(t, certs)
	wrong := redistest.NewCerts(t) // an unrelated CA

	decides := func(t *testing.T, h *Handler) {
		t.Helper()
		logs := provision(t, h, newTestClock())
		for i := range 3 {
			o := mustServe(t, h, nil)
			if o.code != http.StatusOK || o.source != "redis" {
				t.Fatalf("request %d: status %d source %q, want 200 from redis\n%s", i+1, o.code, o.source, renderLogs(logs))
			}
		}
		expectOutcome(t, "4th", mustServe(t, h, nil), http.StatusTooManyRequests, "redis")
	}
	fails := func(t *testing.T, h *Handler, want ...string) {
		t.Helper()
		logs := provision(t, h, newTestClock())
		o := mustServe(t, h, nil)
		expectOutcome(t, "request", o, http.StatusServiceUnavailable, "fail_closed")
		for _, w := range want {
			if msg, ok := errorLogged(logs, w); !ok {
				t.Errorf("no logged error mentions %q; logs:\n%s", w, renderLogs(logs))
			} else {
				t.Logf("logged: %s", msg)
			}
		}
	}
	// Generous timeouts: a TLS handshake under -race on a busy machine may
	// take longer than the default 250ms dial and 100ms call, and only the
	// first error of a burst is logged, so a timeout would hide the x509
	// cause.
	base := func(r *RedisConfig) *Handler {
		r.Timeout = caddy.Duration(5 * time.Second)
		r.DialTimeout = caddy.Duration(5 * time.Second)
		return &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: r}
	}

	t.Run("ca", func(t *testing.T) {
		t.Parallel()
		decides(t, base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: certs.CAFile}}))
	})
	t.Run("caddyfile tls block", func(t *testing.T) {
		t.Parallel()
		h := new(Handler)
		d := caddyfile.NewTestDispenser(`sliding_ratelimit {
			name ` + uniqueName() + `
			limit 3
			window 1m
			fail closed
			redis {
				address ` + srv.Addr() + `
				timeout 5s
				dial_timeout 5s
				tls {
					ca ` + certs.CAFile + `
				}
			}
		}`)
		if err := h.UnmarshalCaddyfile(d); err != nil {
			t.Fatal(err)
		}
		decides(t, h)
	})
	t.Run("rediss url with ca", func(t *testing.T) {
		t.Parallel()
		decides(t, base(&RedisConfig{URL: "rediss://" + srv.Addr(), TLS: &RedisTLS{CA: certs.CAFile}}))
	})
	t.Run("wrong ca", func(t *testing.T) {
		t.Parallel()
		fails(t, base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: wrong.CAFile}}),
			"x509", "certificate signed by unknown authority")
	})
	t.Run("wrong ca, fail open", func(t *testing.T) {
		t.Parallel()
		h := base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: wrong.CAFile}})
		h.Fail = "open"
		logs := provision(t, h, newTestClock())
		expectOutcome(t, "request", mustServe(t, h, nil), http.StatusOK, "fail_open")
		if _, ok := errorLogged(logs, "certificate signed by unknown authority"); !ok {
			t.Errorf("no x509 error logged:\n%s", renderLogs(logs))
		}
	})
	t.Run("rediss url, system roots", func(t *testing.T) {
		t.Parallel()
		fails(t, base(&RedisConfig{URL: "rediss://" + srv.Addr()}), "x509", "certificate signed by unknown authority")
	})
	t.Run("client certificate", func(t *testing.T) {
		t.Parallel()
		mtls := redistest.StartTLS(t, certs, "--tls-auth-clients", "yes")
		decides(t, base(&RedisConfig{Addresses: []string{mtls.Addr()},
			TLS: &RedisTLS{CA: certs.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile}}))
		fails(t, base(&RedisConfig{Addresses: []string{mtls.Addr()}, TLS: &RedisTLS{CA: certs.CAFile}}))
	})
}

// ---- 4. ACL -------------------------------------------------------------

// redisCallRE matches a command name in redis.call("NAME", ...).
var redisCallRE = regexp.MustCompile(`redis\.p?call\(\s*["']([A-Za-z]+)["']`)

// limiterACLCommands is the least a limiter's ACL user needs: the script
// commands, PING, DEL (the admin API's reset), PUBLISH and SUBSCRIBE (reset
// notices between nodes), and every command the scripts call, read from the
// scripts themselves (Redis checks a script's calls against the caller's
// ACL too, so EVALSHA/EVAL/SCRIPT alone cannot work).
func limiterACLCommands(t *testing.T) []string {
	t.Helper()
	cmds := []string{"+evalsha", "+eval", "+script|load", "+ping", "+del", "+publish", "+subscribe"}
	seen := map[string]bool{}
	for _, src := range lua.Files {
		for _, m := range redisCallRE.FindAllStringSubmatch(src, -1) {
			if c := strings.ToLower(m[1]); !seen[c] {
				seen[c] = true
				cmds = append(cmds, "+"+c)
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("found no redis.call in the scripts")
	}
	return cmds
}

// createLimiterACLUser creates the ACL user "limiter" with password "s3cret", limited
// to keys under the default key prefix and to limiterACLCommands.
func createLimiterACLUser(t *testing.T, srv *redistest.Server) {
	t.Helper()
	cmds := limiterACLCommands(t)
	args := append([]string{"ACL", "SETUSER", "limiter", "reset", "on", ">s3cret", "~" + limiter.DefaultKeyPrefix + "*",
		"resetchannels", "&" + limiter.DefaultKeyPrefix + "*", "-@all"}, cmds...)
	if got := srv.CLI(t, args...); got != "OK" {
		t.Fatalf("ACL SETUSER: %s", got)
	}
	t.Logf("ACL user: ~%s* -@all %s", limiter.DefaultKeyPrefix, strings.Join(cmds, " "))
}

// TestACL: an ACL user restricted to the default key prefix and to the
// commands above works end to end with every algorithm (clock redis, so
// TIME too); the restriction is real (another prefix gets NOPERM); a wrong
// password is a clear WRONGPASS error in the log, with the fail mode.
func TestACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	createLimiterACLUser(t, srv)
	user := func(password string) *RedisConfig {
		return &RedisConfig{Addresses: []string{srv.Addr()}, Username: "limiter", Password: password, Timeout: caddy.Duration(5 * time.Second)}
	}

	for _, alg := range allAlgorithms(t) {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			h := &Handler{Name: uniqueName(), Algorithm: alg, Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: user("s3cret")}
			logs := provision(t, h, nil) // clock redis: the scripts call TIME
			for i := range 3 {
				o := mustServe(t, h, nil)
				if o.code != http.StatusOK || o.source != "redis" {
					t.Fatalf("request %d: status %d source %q, want 200 from redis\n%s", i+1, o.code, o.source, renderLogs(logs))
				}
			}
			expectOutcome(t, "4th", mustServe(t, h, nil), http.StatusTooManyRequests, "redis")
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"closed", "open"} {
			h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Fail: mode, Redis: user("wrong")}
			logs := provision(t, h, nil)
			o := mustServe(t, h, nil)
			if mode == "closed" {
				expectOutcome(t, "fail closed", o, http.StatusServiceUnavailable, "fail_closed")
			} else {
				expectOutcome(t, "fail open", o, http.StatusOK, "fail_open")
			}
			if msg, ok := errorLogged(logs, "WRONGPASS"); !ok {
				t.Errorf("fail %s: no logged error names WRONGPASS:\n%s", mode, renderLogs(logs))
			} else {
				t.Logf("fail %s, logged: %s", mode, msg)
			}
		}
	})
	t.Run("outside the key pattern", func(t *testing.T) {
		t.Parallel()
		r := user("s3cret")
		r.KeyPrefix = "elsewhere:"
		h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: r}
		logs := provision(t, h, nil)
		expectOutcome(t, "request", mustServe(t, h, nil), http.StatusServiceUnavailable, "fail_closed")
		if msg, ok := errorLogged(logs, "NOPERM"); !ok {
			t.Errorf("no logged error names NOPERM:\n%s", renderLogs(logs))
		} else {
			t.Logf("logged: %s", msg)
		}
	})
}

// TestACLDeniedLimiterDoesNotTripOthers: two limiters share one Redis
// config (the pool key leaves out key_prefix, so they share a client and
// its circuit breaker); one has a key_prefix the ACL user may not write.
// Its NOPERM answers are configuration errors from a Redis that is up, not
// an outage: they must not open the circuit for the other limiter.
func TestACLDeniedLimiterDoesNotTripOthers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	createLimiterACLUser(t, srv)
	cfg := func(prefix string) *RedisConfig {
		return &RedisConfig{Addresses: []string{srv.Addr()}, Username: "limiter", Password: "s3cret", KeyPrefix: prefix,
			Timeout: caddy.Duration(5 * time.Second)}
	}
	good := &Handler{Name: uniqueName(), Limit: "100", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: cfg("")}
	bad := &Handler{Name: uniqueName(), Limit: "100", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: cfg("elsewhere:")}
	provision(t, good, nil)
	provision(t, bad, nil)
	if redisBreaker(t, good) != redisBreaker(t, bad) {
		t.Fatal("the two limiters do not share a Redis store; the test needs them to")
	}
	expectOutcome(t, "good limiter", mustServe(t, good, nil), http.StatusOK, "redis")
	for range 20 {
		expectOutcome(t, "denied limiter", mustServe(t, bad, nil), http.StatusServiceUnavailable, "fail_closed")
	}
	for i := range 5 {
		o := mustServe(t, good, nil)
		if o.code != http.StatusOK || o.source != "redis" {
			t.Fatalf("good limiter, request %d after the other's NOPERM errors: status %d source %q (circuit %s); "+
				"a Redis error reply opened the shared circuit breaker", i+1, o.code, o.source, redisBreaker(t, good).State())
		}
	}
}

// ---- 5. Outage under load -----------------------------------------------

// TestOutageUnderLoad: 8 goroutines send requests through one handler
// (Redis timeout 100ms); Redis is killed while they run, then restarted.
//   - no request takes longer than the timeout plus 150ms;
//   - the circuit breaker opens during the outage;
//   - fail open admits everything meanwhile (source fail_open);
//   - fail local still enforces the limit per instance: limit 10 on a
//     hot key fresh at the kill, frozen clock, so at most 10 admitted
//     locally, the rest 429;
//   - after the restart, decisions come from Redis again within a few
//     seconds, with the same handler (no Caddy restart).
//
// Not parallel: it asserts latencies, which CPU-bound neighbours (on a
// small machine, under -race) would stretch whatever the limiter does.
func TestOutageUnderLoad(t *testing.T) {
	for _, mode := range []string{"open", "local"} {
		// killed: connections refused at once; hung (SIGSTOP, then SIGCONT):
		// every call to Redis would cost the full timeout.
		for _, how := range []string{"killed", "hung"} {
			t.Run(mode+"/"+how, func(t *testing.T) {
				runOutageUnderLoad(t, mode, how == "hung")
			})
		}
	}
}

func runOutageUnderLoad(t *testing.T, mode string, hang bool) {
	const (
		workers  = 8
		timeout  = 100 * time.Millisecond
		margin   = 150 * time.Millisecond
		limit    = 10
		upFor    = 700 * time.Millisecond  // load before the kill
		downFor  = 1200 * time.Millisecond // outage
		recovery = 6 * time.Second         // breaker's max cool-down (5s) + slack
		pace     = time.Millisecond        // between a worker's requests: load, not a CPU-bound spin
	)
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: Amount(strconv.Itoa(limit)), Window: caddy.Duration(time.Minute),
		Fail: mode, Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(timeout)}}
	logs := provision(t, h, newTestClock()) // frozen: the hot key's window never ends
	breaker := redisBreaker(t, h)

	type key struct {
		phase  int32 // 0 up, 1 down, 2 restarted
		source string
		code   int
		hot    bool
	}
	var (
		phase               atomic.Int32
		stop                atomic.Bool
		mu                  sync.Mutex
		counts              = map[key]int{}
		slowest             time.Duration
		problems            []string
		backAt              atomic.Int64 // unix ns of the first redis decision after the restart
		sawOpen             atomic.Bool
		downTotal, downSlow int // requests while Redis is away, and those that waited for it
		wg                  sync.WaitGroup
	)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				// The hot key of the outage is fresh when Redis goes away:
				// a key already denied before would be denied by the deny
				// cache, never reaching the local store.
				p := phase.Load()
				id, hot := "hot-up", false
				if p > 0 {
					id, hot = "hot-down", true
				}
				if n%2 == 1 {
					id, hot = fmt.Sprintf("cold-%d-%d", g, n), false
				}
				o := serveOutcome(h, map[string]string{"X-API-Key": id})
				mu.Lock()
				counts[key{p, o.source, o.code, hot}]++
				slowest = max(slowest, o.took)
				if p == 1 {
					downTotal++
					if o.took >= timeout/2 {
						downSlow++
					}
				}
				if o.took > timeout+margin || o.err != nil || o.code >= 500 {
					problems = append(problems, fmt.Sprintf("phase %d: status %d source %q took %s err %v", p, o.code, o.source, o.took, o.err))
				}
				mu.Unlock()
				if p == 2 && o.source == "redis" {
					backAt.CompareAndSwap(0, time.Now().UnixNano())
				}
				time.Sleep(pace)
			}
		}()
	}
	// The breaker's state, sampled while Redis is down.
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for !stop.Load() {
			if phase.Load() == 1 && breaker.State() == limiter.Open {
				sawOpen.Store(true)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { // stop the load whatever happens
		stop.Store(true)
		wg.Wait()
		<-sampled
	}()

	// A phase starts just before its event: requests of phase 1 may still
	// reach Redis while it dies, those of phase 2 miss it while it starts.
	time.Sleep(upFor)
	phase.Store(1)
	if hang {
		srv.Pause()
	} else {
		srv.Kill()
	}
	time.Sleep(downFor)
	phase.Store(2)
	if hang {
		srv.Resume()
	} else {
		srv.Restart()
	}
	restarted := time.Now()
	for backAt.Load() == 0 && time.Since(restarted) < recovery {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a little load on the recovered Redis
	stop.Store(true)
	wg.Wait()
	<-sampled

	t.Logf("fail %s: slowest request %s; outcomes (phase, source, status, hot key): %v", mode, slowest, counts)
	for i, p := range problems {
		if i == 10 {
			t.Errorf("... and %d more", len(problems)-10)
			break
		}
		t.Errorf("request over %s or failed: %s", timeout+margin, p)
	}
	if counts[key{0, "redis", http.StatusOK, false}] == 0 {
		t.Fatalf("no request was decided by Redis before the kill: %v", counts)
	}
	if !sawOpen.Load() {
		t.Errorf("the circuit breaker never opened during the outage")
	}
	// With the circuit open a request costs no timeout: only the calls in
	// flight when Redis went away, those until the circuit opened and one
	// probe per cool-down may wait (a handful); not a steady share.
	t.Logf("while Redis was away: %d requests, %d of them waited %s or more", downTotal, downSlow, timeout/2)
	if downTotal < 200 {
		t.Errorf("only %d requests while Redis was away: too little load to judge", downTotal)
	}
	if downSlow > 40 {
		t.Errorf("%d of %d requests waited for Redis while it was away: the circuit breaker does not spare the timeout", downSlow, downTotal)
	}
	if b := backAt.Load(); b == 0 {
		t.Errorf("no decision from Redis within %s of its restart (circuit %s); logs:\n%s", recovery, breaker.State(), renderLogs(logs))
	} else {
		t.Logf("decisions from redis again %s after the restart", time.Unix(0, b).Sub(restarted).Round(time.Millisecond))
	}

	var downOK, local, localOKHot, localDeniedHot int
	for k, n := range counts {
		if k.source == sourceLocal {
			local += n
			if k.hot && k.code == http.StatusOK {
				localOKHot += n
			}
		}
		if k.hot && k.phase == 1 && k.code == http.StatusTooManyRequests && k.source != "redis" {
			localDeniedHot += n // by the local store, or by the deny cache after it
		}
		if k.phase == 1 && k.code == http.StatusOK {
			downOK += n
		}
		if mode == "open" && k.phase == 1 && k.source != sourceFailOpen && k.source != "redis" {
			t.Errorf("fail open, Redis down: %d requests with source %q", n, k.source)
		}
		if mode == "open" && k.source == sourceLocal {
			t.Errorf("fail open decided %d requests locally", n)
		}
	}
	switch mode {
	case "open":
		if counts[key{1, sourceFailOpen, http.StatusOK, true}] == 0 || counts[key{1, sourceFailOpen, http.StatusOK, false}] == 0 {
			t.Errorf("fail open admitted nothing while Redis was down: %v", counts)
		}
	case "local":
		if local == 0 {
			t.Fatalf("fail local: no request decided locally while Redis was down: %v", counts)
		}
		if localOKHot > limit {
			t.Errorf("fail local admitted %d requests on the hot key, over its limit of %d per window", localOKHot, limit)
		}
		if localOKHot == 0 || localDeniedHot == 0 {
			t.Errorf("fail local on the hot key: %d admitted, %d denied; want the limit enforced (some of each)", localOKHot, localDeniedHot)
		}
	}
	if downOK == 0 {
		t.Errorf("nothing admitted while Redis was down (fail %s)", mode)
	}
	if after := counts[key{2, "redis", http.StatusOK, false}]; after == 0 && backAt.Load() != 0 {
		t.Errorf("no cold request admitted by Redis after the restart: %v", counts)
	}
}

// ---- 6. Config reload under load ----------------------------------------

// reloadTestConfig is a Caddyfile with two limiters: one on Redis whose limit
// changes from load to load, one in-process that never changes, and
// optionally without the Redis one.
func reloadTestConfig(redisAddr, memName string, redisLimit int, withRedis bool) string {
	redisRoute := ""
	if withRedis {
		redisRoute = `
	route /redis {
		sliding_ratelimit {
			name    reload-redis
			key     {http.request.header.X-API-Key}
			limit   ` + strconv.Itoa(redisLimit) + `
			window  1m
			redis   redis://` + redisAddr + ` {
				timeout 2s
			}
		}
		respond "ok"
	}`
	}
	return `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
}
http://localhost:9080 {` + redisRoute + `
	route /memory {
		sliding_ratelimit {
			name    ` + memName + `
			key     {http.request.header.X-API-Key}
			limit   10
			window  1m
		}
		respond "ok"
	}
}
`
}

// TestReloadUnderLoad posts 5 changed configs to Caddy's admin /load while
// 8 goroutines send requests. No request fails (only 200 or 429; a request
// Caddy's listener swap drops in the transport is retried once and must
// then succeed); the new limit applies; the unchanged in-process
// limiter keeps its counts; the Redis client and its pool are the same
// object throughout and Redis sees no new connections pile up; loading a
// config without the Redis limiter closes the client.
// Not parallel: Caddy's admin endpoint and ports are process-wide.
func TestReloadUnderLoad(t *testing.T) {
	defer func() {
		if t.Skipped() {
			t.Errorf("caddytest skipped the test; it must run")
		}
	}()
	const workers = 8
	srv := redistest.Start(t)
	memName := "reload-mem-" + uniqueName()
	limit := 100
	tester := caddytest.NewTester(t)
	tester.InitServer(reloadTestConfig(srv.Addr(), memName, limit, true), "caddyfile")
	if t.Failed() {
		t.FailNow()
	}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers + 2}}
	defer client.CloseIdleConnections()
	get := func(path, key string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, "http://localhost:9080"+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-API-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	mustGet := func(path, key string) *http.Response {
		t.Helper()
		resp, err := get(path, key)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp
	}
	remaining := func(resp *http.Response) string { return resp.Header.Get("X-RateLimit-Remaining") }

	// Counts made before any reload: 3 of 10 in process, 3 in Redis.
	for i := range 3 {
		if r := mustGet("/memory", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(9-i) {
			t.Fatalf("/memory before the reloads: status %d remaining %s", r.StatusCode, remaining(r))
		}
		if r := mustGet("/redis", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(limit-1-i) {
			t.Fatalf("/redis before the reloads: status %d remaining %s", r.StatusCode, remaining(r))
		}
	}

	// The Redis store's pool entry: its client is compared across reloads.
	redisEntryOf := func() (any, redisEntry, int) {
		t.Helper()
		var key any
		var entry redisEntry
		found := 0
		stores.Range(func(k, v any) bool {
			if e, ok := v.(redisEntry); ok && strings.Contains(fmt.Sprint(k), srv.Addr()) {
				key, entry = k, e
				found++
			}
			return true
		})
		return key, entry, found
	}
	connected := func() int {
		t.Helper()
		for _, line := range strings.Split(srv.CLI(t, "INFO", "clients"), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("connected_clients %q", v)
				}
				return n - 1 // not redis-cli itself
			}
		}
		t.Fatal("INFO clients has no connected_clients")
		return 0
	}

	// Load: 8 goroutines, fresh keys (always 200), half on each limiter.
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		failures []string
		retried  []string // first attempts lost in the transport, then retried
	)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				path := "/memory"
				if n%2 == 0 {
					path = "/redis"
				}
				key := fmt.Sprintf("load-%s-%d-%d", memName, g, n)
				resp, err := get(path, key)
				if err != nil {
					// A reload makes Caddy (not the limiter) drop a few
					// connections: its old server closes idle keep-alive
					// connections, and on Unix each config binds a new
					// SO_REUSEPORT socket and closes the old one with
					// whatever sat in its accept backlog. A GET lost that
					// way is retried once, as HTTP clients do for
					// idempotent requests; a limiter that panics or hangs
					// fails the retry too.
					mu.Lock()
					retried = append(retried, fmt.Sprintf("GET %s: %v", path, err))
					mu.Unlock()
					resp, err = get(path, key)
				}
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("GET %s (retried): %v", path, err))
				} else {
					statuses[resp.StatusCode]++
					if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
						failures = append(failures, fmt.Sprintf("GET %s: status %d", path, resp.StatusCode))
					}
				}
				mu.Unlock()
			}
		}()
	}
	stopLoad := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopLoad()

	time.Sleep(300 * time.Millisecond) // the pool warms up to the load
	poolKey, before, found := redisEntryOf()
	if found != 1 {
		t.Fatalf("%d Redis stores for %s in the pool, want 1", found, srv.Addr())
	}
	connBefore := connected()

	admin := &http.Client{Timeout: 10 * time.Second}
	for i := 1; i <= 5; i++ {
		limit = 100 + i
		resp, err := admin.Post("http://localhost:2999/load", "text/caddyfile",
			strings.NewReader(reloadTestConfig(srv.Addr(), memName, limit, true)))
		if err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reload %d: status %d: %s", i, resp.StatusCode, body)
		}
		time.Sleep(150 * time.Millisecond) // traffic on the new config
		k, e, n := redisEntryOf()
		if n != 1 || k != poolKey || e.client != before.client || e.Breaker != before.Breaker {
			t.Fatalf("reload %d: the Redis store was replaced (%d entries; same client: %v, same breaker: %v)",
				i, n, e.client == before.client, e.Breaker == before.Breaker)
		}
		if refs, ok := stores.References(poolKey); !ok || refs != 1 {
			t.Errorf("reload %d: the Redis store has %d references (present %v), want 1: a handler leaked it", i, refs, ok)
		}
		if c := connected(); c > workers+2 {
			t.Errorf("reload %d: %d clients connected to Redis (%d before the reloads, %d workers): connections pile up", i, c, connBefore, workers)
		}
	}
	stopLoad()

	mu.Lock()
	t.Logf("statuses under load: %v; Redis clients before the reloads %d, after %d", statuses, connBefore, connected())
	if len(retried) > 0 {
		t.Logf("%d requests lost by Caddy's listener swap and retried, e.g. %s", len(retried), retried[0])
	}
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... and %d more", len(failures)-10)
			break
		}
		t.Errorf("failed during the reloads: %s", f)
	}
	if statuses[http.StatusOK] == 0 {
		t.Error("no request succeeded under load")
	}
	mu.Unlock()

	// The new limit applies; the counts made before the reloads are kept.
	if r := mustGet("/redis", "fresh-"+memName); r.Header.Get("X-RateLimit-Limit") != strconv.Itoa(limit) {
		t.Errorf("after the reloads: X-RateLimit-Limit %s, want %d", r.Header.Get("X-RateLimit-Limit"), limit)
	}
	if r := mustGet("/memory", "steady"); r.StatusCode != http.StatusOK || remaining(r) != "6" {
		t.Errorf("in-process limiter after 5 reloads: status %d remaining %s, want 200 and 6 (3 before + 1): its state was reset",
			r.StatusCode, remaining(r))
	}
	if r := mustGet("/redis", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(limit-4) {
		t.Errorf("redis limiter after 5 reloads: status %d remaining %s, want 200 and %d", r.StatusCode, remaining(r), limit-4)
	}

	// The last user goes: the client is closed, its connections too.
	resp, err := admin.Post("http://localhost:2999/load", "text/caddyfile",
		strings.NewReader(reloadTestConfig(srv.Addr(), memName, limit, false)))
	if err != nil {
		t.Fatalf("final load: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("final load: status %d", resp.StatusCode)
	}
	if _, _, n := redisEntryOf(); n != 0 {
		t.Errorf("the Redis store outlived its last limiter")
	}
	deadline := time.Now().Add(3 * time.Second)
	for connected() > 0 {
		if time.Now().After(deadline) {
			t.Errorf("%d connections to Redis remain after its last limiter went", connected())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := mustGet("/memory", "steady"); remaining(r) != "5" {
		t.Errorf("in-process limiter after the final load: remaining %s, want 5", remaining(r))
	}
}
