package slidingratelimit

// A Redis that answers and refuses the configuration (a wrong password, a
// user without the commands or keys the limiter needs) is a configuration
// error at load; one that does not answer stays a warning.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// provisionErr provisions h as Caddy loads a config, and returns
// Provision's error (a handler that loads is cleaned up at the test's end).
func provisionErr(t *testing.T, h *Handler) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	err := h.Provision(ctx)
	t.Cleanup(func() {
		_ = h.Cleanup()
		cancel()
	})
	return err
}

// TestRedisRefusalIsAConfigError: each refusal is refused at load, in a
// message naming the directive, the address and Redis's own words.
func TestRedisRefusalIsAConfigError(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	createLimiterACLUser(t, srv)
	// A user who may call the scripts (EVALSHA answers it NOSCRIPT, not
	// NOPERM) but not ZADD, which they call.
	args := append([]string{"ACL", "SETUSER", "nozadd", "reset", "on", ">pw", "~" + limiter.DefaultKeyPrefix + "*",
		"resetchannels", "&" + limiter.DefaultKeyPrefix + "*", "-@all"}, limiterACLCommands(t)...)
	if got := srv.CLI(t, append(args, "-zadd")...); got != "OK" {
		t.Fatalf("ACL SETUSER: %s", got)
	}
	if got := srv.CLI(t, "--user", "nozadd", "--pass", "pw", "--no-auth-warning", "EVALSHA", strings.Repeat("0", 40), "0"); !strings.HasPrefix(got, "NOSCRIPT") {
		t.Fatalf("EVALSHA as nozadd: %q, want NOSCRIPT (the user may call scripts)", got)
	}
	locked := redistest.Start(t, "--requirepass", "pw")

	cfg := func(addr, user, pass, prefix string) *RedisConfig {
		return &RedisConfig{Addresses: []string{addr}, Username: user, Password: pass, KeyPrefix: prefix}
	}
	for _, tc := range []struct {
		name   string
		redis  *RedisConfig
		global *RedisConfig
		want   string // after "sliding_ratelimit: limiter NAME: "
	}{
		{"wrong password", cfg(srv.Addr(), "limiter", "wrong", ""), nil,
			"redis: " + srv.Addr() + " answered and refused this configuration: WRONGPASS invalid username-password pair or user is disabled."},
		{"no password", cfg(locked.Addr(), "", "", ""), nil,
			"redis: " + locked.Addr() + " answered and refused this configuration: NOAUTH Authentication required."},
		{"a key outside the user's pattern", cfg(srv.Addr(), "limiter", "s3cret", "elsewhere:"), nil,
			"redis: " + srv.Addr() + " answered and refused this configuration: NOPERM this user has no permissions to access one of the keys used as arguments"},
		{"a command the scripts call", cfg(srv.Addr(), "nozadd", "pw", ""), nil,
			"redis: " + srv.Addr() + " answered and refused this configuration: the ACL user may not run zadd on 'ratelimit:NAME:{access}', which the scripts call (redis.acl_check_cmd)"},
		{"global_redis, wrong password", cfg(srv.Addr(), "", "", ""), cfg(locked.Addr(), "", "wrong", ""),
			"global_redis: " + locked.Addr() + " answered and refused this configuration: WRONGPASS invalid username-password pair or user is disabled."},
		{"global_redis, a command the ledger calls", cfg(srv.Addr(), "", "", ""), cfg(srv.Addr(), "limiter", "s3cret", ""),
			"global_redis: " + srv.Addr() + " answered and refused this configuration: the ACL user may not run hexists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName()
			h := &Handler{Name: name, Limit: "3", Window: caddy.Duration(time.Minute), Redis: tc.redis}
			if tc.global != nil {
				h.Region, h.GlobalLimit, h.Datacenter, h.GlobalRedis = "{http.request.header.X-Region}", "30", "eu", tc.global
			}
			err := provisionErr(t, h)
			want := "sliding_ratelimit: limiter " + name + ": " + strings.ReplaceAll(tc.want, "NAME", name)
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("provision: %v\nwant an error starting %q", err, want)
			}
		})
	}
}

// TestRedisNotAnsweringStillLoads: an address nothing listens on is no
// configuration error: the limiter loads, with a warning.
func TestRedisNotAnsweringStillLoads(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	core, logs := observer.New(zap.WarnLevel)
	h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Redis: &RedisConfig{Addresses: []string{addr}}}
	h.rt = &provisioned{logger: zap.New(core)}
	if err := provisionErr(t, h); err != nil {
		t.Fatalf("provision with Redis down: %v, want it to load", err)
	}
	if n := len(logs.FilterMessageSnippet("redis does not answer at start").All()); n != 1 {
		t.Fatalf("%d warnings that redis does not answer, want 1:\n%s", n, fmt.Sprint(logs.All()))
	}
}

// TestCaddyValidateRefusesARefusingRedis runs this repo's Caddy as a user
// would: `caddy validate` of a config whose Redis (or ledger) refuses the
// password exits non-zero with Redis's words; one whose Redis does not
// answer is valid, with the warning.
func TestCaddyValidateRefusesARefusingRedis(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	locked := redistest.Start(t, "--requirepass", "pw")
	open := redistest.Start(t)
	down := freeAddr(t) // nothing listens there
	for _, tc := range []struct {
		name, block string
		ok          bool
		want        string
	}{
		{"wrong password", "redis redis://:wrong@" + locked.Addr(), false,
			"redis: " + locked.Addr() + " answered and refused this configuration: WRONGPASS invalid username-password pair or user is disabled."},
		{"no password", "redis redis://" + locked.Addr(), false,
			"redis: " + locked.Addr() + " answered and refused this configuration: NOAUTH Authentication required."},
		{"global_redis, wrong password", "redis redis://" + open.Addr() + "\n\t\tregion {http.request.header.X-Region}\n\t\tglobal_limit 50\n\t\tdatacenter eu\n\t\tglobal_redis redis://:wrong@" + locked.Addr(), false,
			"global_redis: " + locked.Addr() + " answered and refused this configuration: WRONGPASS invalid username-password pair or user is disabled."},
		{"not answering", "redis redis://" + down, true, "redis does not answer at start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cf := filepath.Join(t.TempDir(), "Caddyfile")
			src := fmt.Sprintf("{\n\tadmin off\n}\n:%s {\n\tsliding_ratelimit {\n\t\tname api\n\t\tlimit 5\n\t\twindow 1m\n\t\t%s\n\t}\n\trespond ok\n}\n",
				strings.Split(freeAddr(t), ":")[1], tc.block)
			if err := os.WriteFile(cf, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "validate", "--config", cf, "--adapter", "caddyfile")
			cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Fatalf("caddy validate: %v, want success %v\n%s", err, tc.ok, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("caddy validate printed no %q:\n%s", tc.want, out)
			}
			if tc.ok && !strings.Contains(string(out), "Valid configuration") {
				t.Fatalf("caddy validate did not say the configuration is valid:\n%s", out)
			}
			t.Logf("%s", out)
		})
	}
}
