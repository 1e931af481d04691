package redistest

import (
	"context"
	"strings"
	"testing"
)

// TestStartRedis6: .ci/redis6's Redis answers as 6.0.16, runs a script
// that uses cjson (a module its Lua loads by require), and a script's
// global set by rawset outlives the call, as lua.DecideCached needs.
func TestStartRedis6(t *testing.T) {
	s := StartRedis6(t)
	c := s.Client(t)
	ctx := context.Background()
	info, err := c.Info(ctx, "server").Result()
	if err != nil || !strings.Contains(info, "redis_version:6.0.16") {
		t.Fatalf("INFO server: %v\n%s", err, info)
	}
	if v, err := c.Eval(ctx, `return cjson.decode(ARGV[1])[2]`, nil, "[1,7]").Int(); err != nil || v != 7 {
		t.Fatalf("cjson: %v %v", v, err)
	}
	if err := c.Eval(ctx, `rawset(_G, "redistest_kept", 42) return 1`, nil).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Eval(ctx, `return rawget(_G, "redistest_kept")`, nil).Int(); err != nil || v != 42 {
		t.Fatalf("a global set by rawset, read by the next call: %v %v, want 42", v, err)
	}
}

// TestRedis6Missing: without .ci/redis6's files the error names the
// command that fetches them.
func TestRedis6Missing(t *testing.T) {
	t.Setenv("REDIS6_DIR", t.TempDir())
	if _, _, err := Redis6(); err == nil || !strings.Contains(err.Error(), ".ci/redis6") {
		t.Fatalf("Redis6 with nothing fetched: %v, want an error naming .ci/redis6", err)
	}
}
