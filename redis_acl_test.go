package slidingratelimit

// ACL: a limiter works as a Redis user limited to its keys, channels and
// commands.

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// redisCallRE matches a command name in redis.call("NAME", ...) and in
// call("NAME", ...) (the script keeps redis.call in a local).
var redisCallRE = regexp.MustCompile(`\bp?call\(\s*["']([A-Za-z]+)["']`)

// limiterACLCommands is the least a limiter's ACL user needs: the script
// commands (FCALL and FUNCTION LOAD for the function library, EVALSHA, EVAL
// and SCRIPT LOAD for the script and for override.lua), PING, DEL (the admin API's reset), PUBLISH and SUBSCRIBE (reset
// notices between nodes), and every command the scripts call, read from the
// scripts themselves (Redis checks a script's calls against the caller's
// ACL too, so EVALSHA/EVAL/SCRIPT alone cannot work).
func limiterACLCommands(t *testing.T) []string {
	t.Helper()
	cmds := []string{"+fcall", "+fcall_ro", "+function|load", "+evalsha", "+eval", "+script|load", "+ping", "+del", "+publish", "+subscribe"}
	seen := map[string]bool{}
	for name, src := range lua.Files {
		if name == "ledger.lua" {
			continue // it runs on the ledger (global_redis): ledgerACLCommands
		}
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

// ledgerACLCommands lists what a ledger's user (global_redis) runs: its
// script, WAIT, TIME, the reset's DEL, and what ledger.lua calls.
func ledgerACLCommands(t *testing.T) []string {
	t.Helper()
	cmds := []string{"+evalsha", "+eval", "+script|load", "+wait", "+time", "+ping", "+del"}
	seen := map[string]bool{"time": true, "del": true}
	for _, m := range redisCallRE.FindAllStringSubmatch(lua.Files["ledger.lua"], -1) {
		if c := strings.ToLower(m[1]); !seen[c] {
			seen[c] = true
			cmds = append(cmds, "+"+c)
		}
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
// password changed after the load is a clear WRONGPASS error in the log,
// with the fail mode.
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
			h := &Handler{Name: uniqueName(), Algorithm: alg, Key: "{http.request.header.X-API-Key}", Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: user("s3cret")}
			logs := provision(t, h, nil) // clock redis: the scripts call TIME
			hdr := map[string]string{"X-API-Key": "K"}
			for i := range 3 {
				o := mustServe(t, h, hdr)
				if o.code != http.StatusOK || o.source != "redis" {
					t.Fatalf("request %d: status %d source %q, want 200 from redis\n%s", i+1, o.code, o.source, renderLogs(logs))
				}
			}
			expectOutcome(t, "4th", mustServe(t, h, hdr), http.StatusTooManyRequests, "redis")
			// An override (override.lua, and the decision reading it) as
			// the same user: twice the limit, so the 5th gets in.
			if code, body := adminOverride(t, http.MethodPut, h.Name, "key=K&factor=2&ttl=1m"); code != http.StatusOK {
				t.Fatalf("override as the ACL user: %d %s", code, body)
			}
			expectOutcome(t, "5th, under a factor of 2", mustServe(t, h, hdr), http.StatusOK, "redis")
		})
	}
	// A password or a key pattern that changes after the load (refused at
	// load: TestRedisRefusalIsAConfigError) is the fail mode's, and logged.
	t.Run("password changed after the load", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"closed", "open"} {
			name := uniqueName()
			h := &Handler{Name: name, Limit: "3", Window: caddy.Duration(time.Minute), Fail: mode, Redis: user("s3cret")}
			h.Redis.Username = aclUserLike(t, srv, name)
			logs := provision(t, h, nil)
			srv.CLI(t, "ACL", "SETUSER", h.Redis.Username, "resetpass", ">other")
			srv.CLI(t, "CLIENT", "KILL", "USER", h.Redis.Username)
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
	t.Run("key pattern changed after the load", func(t *testing.T) {
		t.Parallel()
		name := uniqueName()
		h := &Handler{Name: name, Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: user("s3cret")}
		h.Redis.Username = aclUserLike(t, srv, name)
		logs := provision(t, h, nil)
		srv.CLI(t, "ACL", "SETUSER", h.Redis.Username, "resetkeys", "~elsewhere:*")
		expectOutcome(t, "request", mustServe(t, h, nil), http.StatusServiceUnavailable, "fail_closed")
		if msg, ok := errorLogged(logs, "NOPERM"); !ok {
			t.Errorf("no logged error names NOPERM:\n%s", renderLogs(logs))
		} else {
			t.Logf("logged: %s", msg)
		}
	})
}

// aclUserLike creates the ACL user "u-<name>" with the rights and password of
// "limiter" (createLimiterACLUser), for a test that changes them.
func aclUserLike(t *testing.T, srv *redistest.Server, name string) string {
	t.Helper()
	u := "u-" + name
	args := append([]string{"ACL", "SETUSER", u, "reset", "on", ">s3cret", "~" + limiter.DefaultKeyPrefix + "*",
		"resetchannels", "&" + limiter.DefaultKeyPrefix + "*", "-@all"}, limiterACLCommands(t)...)
	if got := srv.CLI(t, args...); got != "OK" {
		t.Fatalf("ACL SETUSER: %s", got)
	}
	return u
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
	bad.Redis.KeyPrefix = limiter.DefaultKeyPrefix + "elsewhere:"
	provision(t, good, nil)
	provision(t, bad, nil)
	// Then the user loses bad's keys (refused at load, the prefix would
	// not load: TestRedisRefusalIsAConfigError).
	srv.CLI(t, "ACL", "SETUSER", "limiter", "resetkeys", "~"+limiter.DefaultKeyPrefix+good.Name+":*")
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
