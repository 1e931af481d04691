package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// TestRedisClock runs every algorithm on Redis TIME (clock redis: the
// Policy has no app clock, so the script reads the time).
func TestRedisClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := limiter.NewRedisStore(srv.Client(t))
	ctx := context.Background()
	const window = time.Hour
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			l, err := limiter.New(limiter.Policy{Name: "clock", Algorithm: alg, Windows: []limiter.Window{{Duration: window}}},
				limiter.Backend{Store: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
			if err != nil {
				t.Fatal(err)
			}
			// A fixed window could turn over during the run; that happens
			// once an hour, so try again then.
			for attempt := 0; ; attempt++ {
				start := time.Now()
				in := &limiter.Input{Identity: randomID(t), Limits: []int64{3}}
				var ds [4]limiter.Decision
				for i := range ds {
					if ds[i], err = l.Decide(ctx, in); err != nil || ds[i].Err != nil {
						t.Fatal(err, ds[i].Err)
					}
				}
				if start.Truncate(window) != time.Now().Truncate(window) && attempt < 2 {
					continue
				}
				for i, d := range ds[:3] {
					if !d.Pass || d.Windows[0].Count != int64(i+1) {
						t.Fatalf("request %d: %+v, want allowed with count %d", i+1, d, i+1)
					}
				}
				d := ds[3]
				if d.Pass || d.Windows[0].Count != 3 {
					t.Fatalf("request 4: %+v, want denied with count 3", d)
				}
				// Plausible: at most a window (the counter's estimate may
				// need part of the next one), for the token bucket about
				// one emission interval (20 min).
				lo, hi := time.Duration(0), window
				switch alg {
				case limiter.TokenBucket:
					lo, hi = window/3-time.Minute, window/3
				case limiter.SlidingCounter:
					hi = 2 * window
				}
				if d.RetryAfter <= lo || d.RetryAfter > hi {
					t.Fatalf("request 4: retry after %s, want in (%s, %s]", d.RetryAfter, lo, hi)
				}
				peek, err := l.Peek(ctx, in)
				if err != nil || peek.Pass || peek.Windows[0].Count != 3 {
					t.Fatalf("peek: %+v, %v; want denied with count 3", peek, err)
				}
				return
			}
		})
	}
}

// TestRedisTTL: every key the script writes (a bucket of each algorithm,
// calendar periods, a global ceiling, a ban, a lease) has a TTL, and once
// it has run out the keys are gone.
func TestRedisTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client)
	ctx := context.Background()
	const window = 300 * time.Millisecond
	for _, alg := range allAlgorithms {
		l, err := limiter.New(limiter.Policy{Name: "ttl-" + alg.String(), KeyPrefix: "ttl:", Algorithm: alg, Regions: true,
			Windows:       []limiter.Window{{Duration: window}},
			GlobalWindows: []limiter.Window{{Duration: window}},
			Ban:           &limiter.Ban{After: 2, Within: window, For: window},
			Concurrency:   true, LeaseTimeout: window,
		}, limiter.Backend{Store: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
		if err != nil {
			t.Fatal(err)
		}
		in := &limiter.Input{Identity: "id", Region: "eu", Limits: []int64{2}, GlobalLimits: []int64{100}, MaxConcurrent: 100}
		for i := 0; i < 5; i++ { // admitted, then denied into the ban
			if _, err := l.Decide(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
	}
	cal, err := limiter.New(limiter.Policy{Name: "ttl-cal", KeyPrefix: "ttl:", Windows: []limiter.Window{{Period: limiter.PeriodHour}}},
		limiter.Backend{Store: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cal.Decide(ctx, &limiter.Input{Identity: "id", Limits: []int64{5}}); err != nil {
		t.Fatal(err)
	}
	keys := client.Keys(ctx, "ttl:*").Val()
	kinds := map[string]bool{}
	var longest time.Duration
	for _, k := range keys {
		ttl := client.PTTL(ctx, k).Val()
		if ttl <= 0 {
			t.Errorf("key %s has PTTL %s, want > 0", k, ttl)
		}
		if !strings.Contains(k, ":calendar:") {
			longest = max(longest, ttl)
		}
		kinds[strings.Split(k, ":")[2]] = true
	}
	for _, k := range []string{"log", "counter", "fixed", "token", "calendar", "ban", "lease"} {
		if !kinds[k] {
			t.Errorf("no %s key written (keys: %v)", k, keys)
		}
	}
	time.Sleep(longest + 100*time.Millisecond) // a real TTL: real time must pass
	for _, k := range keys {
		if !strings.Contains(k, ":calendar:") && client.Exists(ctx, k).Val() != 0 {
			t.Errorf("key %s still exists after its TTL", k)
		}
	}
}

// TestRedisMemoryPerKey: what one key of each algorithm holds in a real
// Redis, full at limit 100 and 1000 (MEMORY USAGE; the requests spread over
// the window), within the figures the reference (docs/reference.md) gives.
func TestRedisMemoryPerKey(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client)
	ctx := context.Background()
	clock := &testClock{t: t0}
	bounds := map[string]map[int64]int64{ // bytes, from docs/reference.md's table with 15% to spare
		"sliding_log":     {100: 3700, 1000: 137000},
		"sliding_counter": {100: 510, 1000: 510},
		"fixed_window":    {100: 140, 1000: 140},
		"token_bucket":    {100: 212, 1000: 212}, // 184: its tat written with ".0" and its field p (lua/token_bucket.lua)
	}
	for _, limit := range []int64{100, 1000} {
		for _, alg := range allAlgorithms {
			l, err := limiter.New(limiter.Policy{Name: "default", Algorithm: alg, Windows: []limiter.Window{{Duration: time.Minute}},
				AppClock: true, Now: clock.Now}, limiter.Backend{Store: store, Source: limiter.SourceRedis})
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("203.0.113.7-%d", limit)
			in := &limiter.Input{Identity: id, Limits: []int64{limit}}
			for i := int64(0); i < limit; i++ {
				// Spread over the window: every bucket of a counter holds units.
				clock.Set(t0.Add(time.Duration(i) * (time.Minute - time.Second) / time.Duration(limit)))
				if d, err := l.Decide(ctx, in); err != nil || !d.Pass {
					t.Fatalf("%s: %+v, %v", alg, d, err)
				}
			}
			key := l.Keys().Key([]string{"log", "counter", "fixed", "token"}[alg], id, false, "")
			bytes, err := client.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			enc := client.ObjectEncoding(ctx, key).Val()
			t.Logf("MEMORY USAGE %-16s limit %4d, full: %6d bytes (%s; key %d bytes)", alg, limit, bytes, enc, len(key))
			if b := bounds[alg.String()][limit]; bytes > b {
				t.Errorf("%s at limit %d: %d bytes, more than docs/reference.md's %d", alg, limit, bytes, b)
			}
		}
	}
}

// TestSlidingLogRebase: a log whose running total of units nears 2^52 (a
// key that admitted that much without going idle) rewrites its members
// from zero, and its counts and retry times stay exact.
func TestSlidingLogRebase(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	for _, s := range []struct {
		name  string
		store limiter.Store
	}{{"redis-server", limiter.NewRedisStore(client)}, {"redis-server format 1", limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.LogFormat1))},
		{"redis-server format 2", limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.LogFormat2))},
		{"memory", limiter.NewMemoryStore()}} {
		key := "rebase:{" + s.name + "}"
		now := t0.UnixMicro()
		op := func(cost, at int64) limiter.Reply {
			o := logOp(key, 10*time.Second, 1<<50, now+at)
			o.Cost = cost
			r, err := s.store.Do(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		op(1, 0)
		first := int64(2) // the rank of a log's first entry: format 1 has "#n" and "#t" before it
		if s.name == "redis-server format 2" {
			first = 1 // format 2: "#2"
		}
		if s.name == "redis-server" {
			// Format 3: the newest entry (ZRANGE 0 0) says T, in its bytes.
			client.ZRemRangeByRank(ctx, key, 0, 0)
			client.ZAdd(ctx, key, redis.Z{Score: -float64(now), Member: log3Member(1<<52-6, 1, now)})
		} else if s.name != "memory" {
			// Bring T (the units ever admitted) to just under 2^52: in format
			// 1 "#n" holds it, in format 2 the newest entry's B and cost.
			if first == 2 {
				client.ZAdd(ctx, key, redis.Z{Score: -(1<<52 - 5) - 1, Member: "#n"})
			}
			client.ZAdd(ctx, key, redis.Z{Score: float64(now), Member: fmt.Sprintf("%016d", 1<<52-6)})
			client.ZRem(ctx, key, fmt.Sprintf("%016d", 0))
		} else {
			for i := 0; i < 4; i++ { // the in-process store keeps int64: no rebase to reach
				op(1<<50, 0)
			}
		}
		before := op(3, 1000).Usage[0].Count
		r := op(4, 2000)
		if r.Status != limiter.StatusAllowed || r.Usage[0].Count != before+4 {
			t.Fatalf("%s: across the rebase: %+v, want count %d", s.name, r, before+4)
		}
		if s.name == "redis-server" {
			// The oldest entry (ZREVRANGE 1 1, after "#3") has B 0.
			members := client.ZRevRange(ctx, key, 1, -1).Val()
			if len(members) == 0 || members[0][:7] != log3Member(0, 1, 0)[:7] {
				t.Fatalf("members after the rebase: %q, want them counted from 0", members)
			}
		} else if s.name != "memory" {
			members := client.ZRange(ctx, key, first, -1).Val()
			if len(members) == 0 || !strings.HasPrefix(members[0], "0000000000000000") {
				t.Fatalf("members after the rebase: %v, want them counted from 0", members)
			}
		}
	}
}

// TestScriptsNeedRedis5: every command the script runs, and the forms it
// runs them in, exist in Redis 5.0, the oldest version docs/redis.md states
// (where a script may write after reading TIME without further ado). Read
// from the running redis-server's COMMAND DOCS.
func TestScriptsNeedRedis5(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	call := regexp.MustCompile(`\bp?call\(\s*"([A-Za-z]+)"`)
	seen := map[string]bool{}
	for name, src := range lua.Files {
		for _, m := range call.FindAllStringSubmatch(src, -1) {
			cmd := strings.ToLower(m[1])
			if seen[cmd] {
				continue
			}
			seen[cmd] = true
			since, history := commandDocs(t, client, cmd)
			if versionAbove(since, "5.0.0") {
				t.Errorf("%s runs %s, which Redis has since %s", name, cmd, since)
			}
			for _, h := range history {
				// Forms added after 5.0 would be ones the script relies on.
				if versionAbove(h[0], "5.0.0") {
					t.Logf("%s: %s since %s (a form the script does not use)", cmd, h[1], h[0])
				}
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d commands in the script", len(seen))
	}
}

// commandDocs reads COMMAND DOCS cmd: the version the command appeared in,
// and its history (version, change).
func commandDocs(t *testing.T, client *redis.Client, cmd string) (since string, history [][2]string) {
	t.Helper()
	raw, err := client.Do(context.Background(), "COMMAND", "DOCS", cmd).Result()
	if err != nil {
		t.Fatalf("COMMAND DOCS %s: %v", cmd, err)
	}
	// RESP2 gives arrays of name/value pairs, RESP3 maps.
	pairs := func(v any) map[string]any {
		out := map[string]any{}
		switch x := v.(type) {
		case map[any]any:
			for k, v := range x {
				out[fmt.Sprint(k)] = v
			}
		case []any:
			for i := 0; i+1 < len(x); i += 2 {
				out[fmt.Sprint(x[i])] = x[i+1]
			}
		}
		return out
	}
	fields := pairs(pairs(raw)[cmd])
	since, _ = fields["since"].(string)
	for k := range fields {
		switch k {
		case "history":
			hs, _ := fields[k].([]any)
			for _, h := range hs {
				if pair, ok := h.([]any); ok && len(pair) == 2 {
					v, _ := pair[0].(string)
					d, _ := pair[1].(string)
					history = append(history, [2]string{v, d})
				}
			}
		}
	}
	if since == "" {
		t.Fatalf("COMMAND DOCS %s: no since in %v", cmd, fields)
	}
	return since, history
}

// versionAbove reports whether version a is later than b.
func versionAbove(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < 3; i++ {
		x, _ := strconv.Atoi(pa[min(i, len(pa)-1)])
		y, _ := strconv.Atoi(pb[min(i, len(pb)-1)])
		if x != y {
			return x > y
		}
	}
	return false
}

// TestCluster runs the whole conformance table (every algorithm, regions,
// the global ceiling, several windows, the ban) against a real 3-master
// Redis Cluster, on the bare store and through the production stack (whose
// batches are grouped by hash slot): every script call is legal on a
// cluster (no CROSSSLOT). Then it shows that identities spread over all
// three masters, each identity's keys on one.
func TestCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	for _, be := range []backend{
		{"bare store", func(t *testing.T) limiter.Backend {
			return limiter.Backend{Store: limiter.NewRedisStore(client), Source: limiter.SourceRedis}
		}},
		{"production stack", func(t *testing.T) limiter.Backend { return productionStack(t, client) }},
	} {
		t.Run(be.name, func(t *testing.T) {
			b := be.open(t)
			for _, cc := range conformance {
				t.Run(cc.name, func(t *testing.T) {
					t.Parallel()
					runCase(t, b, cc)
				})
			}
		})
	}

	t.Run("keys spread over every master", func(t *testing.T) {
		ctx := context.Background()
		const ids = 60
		l, err := limiter.New(limiter.Policy{Name: "cluster", KeyPrefix: "spread:", Regions: true,
			Windows: []limiter.Window{{Duration: time.Minute}}, GlobalWindows: []limiter.Window{{Duration: time.Minute}}},
			productionStack(t, client))
		if err != nil {
			t.Fatal(err)
		}
		for i := range ids {
			in := &limiter.Input{Identity: "user-" + strconv.Itoa(i), Region: "eu", Limits: []int64{5}, GlobalLimits: []int64{7}}
			d, err := l.Decide(ctx, in)
			if err != nil || d.Err != nil || !d.Pass || d.Windows[0].Count != 1 || d.Windows[1].Count != 1 {
				t.Fatalf("identity %d: %+v %v, want admitted with counts 1/1", i, d, err)
			}
		}
		total := 0
		for _, srv := range cluster.Servers {
			keys := srv.Client(t).Keys(ctx, "spread:*").Val()
			if len(keys) == 0 {
				t.Errorf("master %s holds none of the %d identities' keys", srv.Addr(), ids)
			}
			onNode := map[string]bool{}
			for _, k := range keys {
				onNode[k] = true
			}
			for i := range ids {
				id := "user-" + strconv.Itoa(i)
				if onNode[l.Keys().Key("log", id, true, "eu")] != onNode[l.Keys().Global("log", id)] {
					t.Errorf("identity %s: bucket and global ceiling on different nodes", id)
				}
			}
			total += len(keys)
		}
		if total != 2*ids {
			t.Errorf("%d keys over the masters, want %d (a bucket and a ceiling per identity)", total, 2*ids)
		}
	})
}

// TestRedisFixedWindowTTL: a fixed window's key expires a second after its
// window ends, whichever of the window's admissions wrote it last: the
// first write in a window sets the TTL and the later ones of that window
// leave it (the same end), so a key admitted again near its window's end
// still lives until then, and one admitted in a new window gets that
// window's TTL.
func TestRedisFixedWindowTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	start := time.UnixMicro(t0.UnixMicro() - t0.UnixMicro()%time.Minute.Microseconds()) // a window's start
	clock := &testClock{t: start.Add(10 * time.Second)}
	l, err := limiter.New(limiter.Policy{Name: "default", Algorithm: limiter.FixedWindow, Windows: []limiter.Window{{Duration: time.Minute}},
		AppClock: true, Now: clock.Now}, limiter.Backend{Store: limiter.NewRedisStore(client), Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	in := &limiter.Input{Identity: "203.0.113.9", Limits: []int64{10}}
	key := l.Keys().Key("fixed", in.Identity, false, "")
	decide := func(at time.Duration, count int64) time.Duration {
		t.Helper()
		clock.Set(start.Add(at))
		d, err := l.Decide(ctx, in)
		if err != nil || !d.Pass || d.Windows[0].Count != count {
			t.Fatalf("at %s: %+v, %v; want admitted, count %d", at, d, err, count)
		}
		return client.PTTL(ctx, key).Val()
	}
	// The window ends 50 s after the first admission: 51 s of TTL.
	first := decide(10*time.Second, 1)
	if first < 50*time.Second || first > 51*time.Second+10*time.Millisecond {
		t.Fatalf("after the first admission PTTL %s, want about 51 s (the window's end and a second)", first)
	}
	// 45 s later on the caller's clock, the same window: the TTL set by the
	// first stays (real time barely moved, so it is about 51 s still, and
	// never less than the 6 s the window has left).
	if ttl := decide(55*time.Second, 2); ttl > first || ttl < first-5*time.Second {
		t.Errorf("after a second admission in the window PTTL %s, want the first's %s, left as it was", ttl, first)
	}
	// The next window: its own TTL, 1 s past its end.
	if ttl := decide(70*time.Second, 1); ttl < 50*time.Second || ttl > 51*time.Second+10*time.Millisecond {
		t.Errorf("after an admission in the next window PTTL %s, want about 51 s", ttl)
	}
}

// log3Member is a format-3 log member (lua/sliding_log.lua): 2^53 - 1 - B
// and t in 7 bytes each, big-endian, then the cost's digits unless 1.
func log3Member(b, cost, t int64) string {
	var m [14]byte
	d := int64(1)<<53 - 1 - b
	for i := 6; i >= 0; i-- {
		m[i], m[7+i] = byte(d), byte(t)
		d, t = d>>8, t>>8
	}
	if cost != 1 {
		return string(m[:]) + strconv.FormatInt(cost, 10)
	}
	return string(m[:])
}

// TestRedisTokenBucketPolicyField: this release's fast path reads a token
// bucket's t and p (its T and B in one field, lua/token_bucket.lua) in
// place of i and b, so a key whose p says another T or B (a reload), or
// has none (the previous release wrote i and b alone), must go to decide,
// which rescales the bucket to the new policy: every reply the in-process
// store's, on a key filled under limit 40 and then checked under limit 80
// (same burst, half the interval), under FCALL and EVALSHA. Afterwards p
// says the new T and B again, beside i and b. It fails when the fast path
// takes a key without p as its own.
func TestRedisTokenBucketPolicyField(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	a := limiter.Win{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 40, Burst: 6} // T 2 s
	b := limiter.Win{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 80, Burst: 6} // T 1 s
	for _, sc := range []struct {
		name  string
		store limiter.Store
	}{{"fcall", limiter.NewRedisStore(client)}, {"evalsha", limiter.NewRedisStore(client, limiter.WithScripts(limiter.ScriptsEval))}} {
		for _, dropP := range []bool{false, true} {
			oracle := limiter.NewMemoryStore()
			key := fmt.Sprintf("tbpolicy:{%s-%v}", sc.name, dropP)
			now := t0.UnixMicro()
			denied := 0
			for i, step := range []struct {
				win  limiter.Win
				dt   int64
				cost int64
			}{{a, 0, 3}, {a, 100_000, 3}, {b, 100_000, 1}, {b, 200_000, 1}, {b, 1_500_000, 2}, {b, 300_000, 1}, {b, 3_000_000, 3}} {
				if i == 2 && dropP {
					// As the previous release leaves a key it wrote first: i and b, no p.
					if n := client.HDel(ctx, key, a.Name+"p").Val(); n != 1 {
						t.Fatalf("%s: the key had no field %sp to drop", sc.name, a.Name)
					}
				}
				now += step.dt
				op := &limiter.Op{Now: now, Cost: step.cost, Mode: limiter.ModeCheck,
					Parts: []limiter.Part{{Key: key, Kind: limiter.KindToken, Windows: []limiter.Win{step.win}}}}
				want, err := oracle.Do(ctx, cloneOp(op))
				if err != nil {
					t.Fatal(err)
				}
				r, err := sc.store.Do(ctx, cloneOp(op))
				if err != nil || r.Status != want.Status || len(r.Usage) != 1 || r.Usage[0] != want.Usage[0] {
					t.Fatalf("%s, p dropped %v, request %d: %+v %v, the in-process store says %+v", sc.name, dropP, i, r, err, want)
				}
				if r.Status != limiter.StatusAllowed {
					denied++
				}
			}
			if denied == 0 {
				t.Errorf("%s, p dropped %v: nothing denied, the check proves nothing", sc.name, dropP)
			}
			f := client.HGetAll(ctx, key).Val()
			if f[a.Name+"p"] != "1000000:6" || f[a.Name+"i"] != "1000000" || f[a.Name+"b"] != "6" {
				t.Errorf("%s, p dropped %v: the key holds %v, want i 1000000, b 6 and p 1000000:6", sc.name, dropP, f)
			}
		}
		sc.store.(interface{ Close() error }).Close()
	}
}

// TestRedisTokenBucketTTL: a token bucket's key lives past its tat + 0.5 s
// after every request, while this release's fast path moves its TTL only
// when tat leaves a span of an eighth of the window (lua/token_bucket.lua,
// tb_fast), and decide (here: count_only records, mode record), which sets
// the TTL to tat + 1 s and writes tat unmarked, writes between them. Costs
// of 1 to 3 at a token a second move tat 1 to 3 s an admission, past the
// 0.5 s a fast write that kept a TTL it should have moved would leave; the
// replies are the in-process store's. Most admissions leave the TTL as it
// is: fewer PEXPIREs than admissions by half, under FCALL and EVALSHA.
func TestRedisTokenBucketTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	for _, sc := range []struct {
		name  string
		store limiter.Store
	}{{"fcall", limiter.NewRedisStore(client)}, {"evalsha", limiter.NewRedisStore(client, limiter.WithScripts(limiter.ScriptsEval))}} {
		oracle := limiter.NewMemoryStore()
		rng := rand.New(rand.NewPCG(4, 29))
		now := t0.UnixMicro()
		win := limiter.Win{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 80, Burst: 10}
		key := "tbttl:{" + sc.name + "}"
		before, err := redistest.ReadCommandStats(ctx, client)
		if err != nil {
			t.Fatal(err)
		}
		fast, decided := 0, 0
		ttls := newTokenTTLs(client)
		for i := range 500 {
			now += 200_000 + rng.Int64N(1_500_000)
			if rng.IntN(10) == 0 {
				now += 5e6 + rng.Int64N(10e6) // the bucket fills up
			}
			op := &limiter.Op{Now: now, Cost: 1 + rng.Int64N(3), Mode: limiter.ModeCheck,
				Parts: []limiter.Part{{Key: key, Kind: limiter.KindToken, Windows: []limiter.Win{win}}}}
			if rng.IntN(20) == 0 {
				op.Mode = limiter.ModeRecord
			}
			where := fmt.Sprintf("%s, request %d", sc.name, i)
			want, err := oracle.Do(ctx, cloneOp(op))
			if err != nil {
				t.Fatal(err)
			}
			r, err := sc.store.Do(ctx, cloneOp(op))
			if err != nil || r.Status != want.Status || r.Usage[0] != want.Usage[0] {
				t.Fatalf("%s: %+v %v, the in-process store says %+v", where, r, err, want)
			}
			if r.Status == limiter.StatusAllowed {
				if op.Mode == limiter.ModeCheck {
					fast++
				} else {
					decided++
				}
			}
			ttls.check(t, key, win.Name, now, where)
		}
		after, err := redistest.ReadCommandStats(ctx, client)
		if err != nil {
			t.Fatal(err)
		}
		pexpires := after["pexpire"].Calls - before["pexpire"].Calls
		if fast < 150 || decided < 10 || pexpires-int64(decided) > int64(fast)/2 {
			t.Errorf("%s: %d PEXPIREs for %d fast admissions and %d records by decide, want at most one for every two fast ones and one a record",
				sc.name, pexpires, fast, decided)
		}
		t.Logf("%s: %d PEXPIREs for %d fast admissions and %d records by decide", sc.name, pexpires, fast, decided)
		sc.store.(interface{ Close() error }).Close()
	}
}
