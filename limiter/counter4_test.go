package limiter_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// lastCounterFormat3 is the last commit whose builds write the counter in
// format 3 alone (JSON, cjson.decode) and know no format 4.
const lastCounterFormat3 = "2e05e59"

// decideAt is the EVALSHA script (lua.Decide) of the build at commit rev,
// spliced from its lua files as its lua.go splices them.
func decideAt(t *testing.T, rev string) string {
	t.Helper()
	show := func(f string) string {
		out, err := exec.Command("git", "show", rev+":lua/"+f).Output()
		if err != nil {
			t.Fatalf("git show %s:lua/%s: %v (the test reads the format-3 build from this clone's history)", rev, f, err)
		}
		return string(out)
	}
	decide := show("decide.lua")
	var algs []string
	for _, f := range []string{"sliding_log.lua", "sliding_counter.lua", "fixed_window.lua", "token_bucket.lua", "share.lua"} {
		algs = append(algs, show(f))
	}
	b := strings.Replace(decide, "-- @algorithms\n", strings.Join(algs, "\n")+"\n", 1)
	return "local KEYS, ARGV = KEYS, ARGV\n" + b[:strings.Index(b, "-- @entry")] + "return run()\n"
}

// TestCounterFormat4FailsFormat3: a key this build writes in the counter's
// format 4 (the default) makes a build of format 3 fail loudly, under each
// of its state formats (kind 2: its format 3, cjson.decode of the field;
// 10: its format 2; 8: its format 1), never read as empty; and under
// state_format 3 this build writes format 3 again, which the format-3
// build reads and counts on from.
func TestCounterFormat4FailsFormat3(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	old := redis.NewScript(decideAt(t, lastCounterFormat3))
	key := "c4:{" + randomID(t) + "}"
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC).UnixMicro()
	wins := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10e6, Limit: 10}}
	op := func(at int64) *limiter.Op {
		return &limiter.Op{Now: at, Cost: 1, Mode: limiter.ModeCheck, Parts: []limiter.Part{{Key: key, Kind: limiter.KindCounter, Windows: wins}}}
	}
	for _, s := range []limiter.Store{limiter.NewRedisStore(c), limiter.NewRedisStore(c, limiter.WithScripts(limiter.ScriptsEval))} {
		for i := range 3 {
			if r, err := s.Do(ctx, op(now+int64(i))); err != nil || r.Status != limiter.StatusAllowed {
				t.Fatalf("check %d: %+v %v", i, r, err)
			}
		}
	}
	if v := c.HGet(ctx, key, "10000000w").Val(); !strings.HasPrefix(v, "[3,#4") {
		t.Fatalf("the field holds %.40q, want format 4", v)
	}
	oldCheck := func(kind string) ([]any, error) {
		shape := `[0,1,1,0,0,0,` + kind + `,1,0,"10000000",10000000,10,0]`
		return old.Run(ctx, c, []string{key}, 1, shape, now+10, 0).Slice()
	}
	for _, kind := range []string{"2", "10", "8"} {
		r, err := oldCheck(kind)
		if err == nil {
			if e, ok := r[0].(error); ok {
				err = e
			}
		}
		if err == nil {
			t.Fatalf("the format-3 build (kind %s) read a format-4 key and answered %v, want an error", kind, r)
		}
		if !strings.Contains(err.Error(), "Expected value") {
			t.Errorf("the format-3 build (kind %s): %v, want cjson.decode's error", kind, err)
		}
	}
	// Rollback: state_format 3 writes the key in format 3; the format-3
	// build reads the six units on.
	f3 := limiter.NewRedisStore(c, limiter.WithStateFormat(limiter.CounterFormat3))
	if r, err := f3.Do(ctx, op(now+5)); err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != 7 {
		t.Fatalf("under state_format 3: %+v %v, want admitted with count 7", r, err)
	}
	if v := c.HGet(ctx, key, "10000000w").Val(); !strings.HasPrefix(v, "[3,") || strings.HasPrefix(v, "[3,#") {
		t.Fatalf("under state_format 3 the field holds %.40q, want format 3", v)
	}
	r, err := oldCheck("2")
	if err != nil {
		t.Fatal(err)
	}
	if rr, ok := r[0].([]any); !ok || rr[0] != int64(1) || rr[3] != int64(8) {
		t.Fatalf("the format-3 build after the rollback: %v, want admitted with count 8", r)
	}
}
