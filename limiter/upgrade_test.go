package limiter_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// previousRelease is the last commit before the state format version: its
// sliding_log keys are in format 1, and it knows no other.
const previousRelease = "50c28e7"

// oldEngineMain serves the previous release's RedisStore over stdin and
// stdout: one JSON Op a line in, one JSON {Reply, Err} a line out.
const oldEngineMain = `package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

func main() {
	c := redis.NewClient(&redis.Options{Addr: os.Args[1], DisableIdentity: true})
	s := limiter.NewRedisStore(c)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var op limiter.Op
		var res struct {
			Reply limiter.Reply
			Err   string
		}
		if err := json.Unmarshal(in.Bytes(), &op); err != nil {
			res.Err = err.Error()
		} else if r, err := s.Do(context.Background(), &op); err != nil {
			res.Err = err.Error()
		} else {
			res.Reply = r
		}
		if out.Encode(res) != nil {
			return
		}
	}
}
`

// buildPreviousRelease builds the previous release's engine from this
// repository's history (git archive of its limiter and lua) into dir,
// offline, with this checkout's go.mod and go.sum: the modules are the ones
// this test's own build has fetched.
func buildPreviousRelease(t *testing.T, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	root, err := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v (the test builds the previous release from this clone's history)", err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "cmd", "oldengine"), 0o755); err != nil {
		t.Fatal(err)
	}
	top := strings.TrimSpace(string(root))
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" limiter lua | tar -x -C "$3"`,
		"sh", top, previousRelease, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s(a shallow clone lacks it: git fetch --unshallow)", previousRelease, err, out)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(top, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "cmd", "oldengine", "main.go"), []byte(oldEngineMain), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "oldengine")
	start := time.Now()
	build := exec.CommandContext(ctx, "nice", "-n", "5", "go", "build", "-o", bin, "./cmd/oldengine")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s's engine: %v\n%s", previousRelease, err, out)
	}
	t.Logf("built %s's engine in %v", previousRelease, time.Since(start).Round(time.Millisecond))
	return bin
}

// oldEngine is a running previous release's engine.
type oldEngine struct {
	in  *json.Encoder
	out *bufio.Scanner
}

func startOldEngine(t *testing.T, bin, addr string) *oldEngine {
	t.Helper()
	cmd := exec.Command(bin, addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &oldEngine{in: json.NewEncoder(stdin), out: sc}
}

// Reset is not used on the previous release's engine.
func (e *oldEngine) Reset(context.Context, ...string) error { return fmt.Errorf("not served") }

func (e *oldEngine) Do(_ context.Context, op *limiter.Op) (limiter.Reply, error) {
	if err := e.in.Encode(op); err != nil {
		return limiter.Reply{}, err
	}
	if !e.out.Scan() {
		return limiter.Reply{}, fmt.Errorf("the previous release's engine ended: %v", e.out.Err())
	}
	var res struct {
		Reply limiter.Reply
		Err   string
	}
	if err := json.Unmarshal(e.out.Bytes(), &res); err != nil {
		return limiter.Reply{}, err
	}
	if res.Err != "" {
		return limiter.Reply{}, fmt.Errorf("%s", res.Err)
	}
	return res.Reply, nil
}

// upgradeOracle is the exact log of every sliding_log key: the units each
// admitted request recorded, and when.
type upgradeOracle map[string][][2]int64

func (o upgradeOracle) count(key string, w, now int64) int64 {
	var n int64
	for _, e := range o[key] {
		if e[0] > now-w {
			n += e[1]
		}
	}
	return n
}

// TestMixedVersions: three nodes share one redis-server through a rolling
// upgrade from the previous release (built from this repository's history)
// to this one, a switch of the log's state format from 1 to 3 (the
// default; the counter's from 1 to 2), nodes writing the log's format 2
// among them, and the way back (format 1 again, then the previous
// release), as docs/redis.md's "Upgrading" says. Requests of the same keys (a bucket in one of two
// regions and the identity's global ceiling, two windows, costs 1 to 3, some
// peeks) go to the nodes in turn, on one clock; every reply must be the
// exact log's: admitted exactly when every window has room (over-admission
// 0), and every window's count the oracle's (no key read as empty). After
// the switch to format 3, the previous release must fail on a key in it
// rather than read it as empty. Not parallel: the build takes both cores
// for seconds, and the parallel tests (timing-sensitive ones among them)
// start only once the sequential ones are done. It runs on Redis 7 (this
// release by FCALL and by EVALSHA on even and odd nodes) and on Redis 6,
// where the previous release calls its scripts by EVALSHA and this one, on
// even nodes, the body it builds once per Lua state (lua.DecideCached).
func TestMixedVersions(t *testing.T) {
	bin := buildPreviousRelease(t, t.TempDir())
	for _, v := range []struct {
		name  string
		start func(testing.TB, ...string) *redistest.Server
	}{{"Redis 7", redistest.Start}, {"Redis 6", redistest.StartRedis6}} {
		t.Run(v.name, func(t *testing.T) { mixedVersions(t, bin, v.start(t)) })
	}
}

// mixedVersions is TestMixedVersions on srv, with the previous release's
// engine bin.
func mixedVersions(t *testing.T, bin string, srv *redistest.Server) {
	old := startOldEngine(t, bin, srv.Addr())
	newStore := func(opts ...limiter.RedisOption) limiter.Store {
		s := limiter.NewRedisStore(srv.Client(t), opts...)
		t.Cleanup(func() { s.Close() })
		return s
	}
	f1 := limiter.WithStateFormat(limiter.LogFormat1)
	eval := limiter.WithScripts(limiter.ScriptsEval)
	f2 := limiter.WithStateFormat(limiter.LogFormat2)
	engines := map[string][2]limiter.Store{ // by version, for even and odd nodes (FCALL, EVALSHA)
		"old": {old, old},
		"f1":  {newStore(f1), newStore(f1, eval)},
		"f2":  {newStore(), newStore(eval)}, // the default: the log and the counter in format 3
		"f2x": {newStore(f2), newStore(f2, eval)},
	}
	// The log's phases: the upgrade to format 3 (the default, "f2" above)
	// as docs/redis.md says it, nodes writing format 2 among them (state_format
	// 2: every format meets every other on one key), and the rollback.
	logPhases := [][3]string{
		{"old", "old", "old"},
		{"f1", "old", "old"}, {"f1", "f1", "old"}, {"f1", "f1", "f1"}, // the rolling upgrade, state_format 1
		{"f2", "f1", "f1"}, {"f2", "f2", "f1"}, {"f2", "f2", "f2"}, // state_format removed, node by node: format 3
		{"f2x", "f2", "f2"}, {"f2x", "f2x", "f1"}, {"f2", "f2x", "f2"}, // nodes writing format 2 among them
		{"f1", "f2", "f2"}, {"f1", "f1", "f2"}, {"f1", "f1", "f1"}, // rollback: state_format 1 first
		{"old", "f1", "f1"}, {"old", "old", "f1"}, {"old", "old", "old"},
	}
	const allNew, allF1 = 6, 12 // every node writes format 3; every node writes format 1 before the previous release comes back
	kb, _ := limiter.NewKeyBuilder("up:", "api")
	rng := rand.New(rand.NewPCG(29, 2))
	oracle := upgradeOracle{}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMicro()
	wins := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10e6, Limit: 8},
		{Name: limiter.WindowName(30 * time.Second), Len: 30e6, Limit: 20}}
	global := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10e6, Limit: 12}}
	ctx := context.Background()
	seen := map[string]int{}
	for ph, nodes := range logPhases {
		var ids []string
		for i := range 4 {
			ids = append(ids, fmt.Sprint("id", i))
		}
		for i := range 80 {
			now += rng.Int64N(300_000)
			node := i % 3
			id := ids[rng.IntN(len(ids))]
			if ph == allF1 && i < 2*len(ids) {
				// Before the previous release comes back, every key is
				// checked by a node writing format 1 (or has expired).
				id, node = ids[i/2], 0
			}
			region := fmt.Sprint("r", rng.IntN(2))
			if ph == allF1 && i < 2*len(ids) {
				region = fmt.Sprint("r", i%2)
			}
			op := &limiter.Op{Now: now, Cost: 1 + rng.Int64N(3), Mode: limiter.ModeCheck, Parts: []limiter.Part{
				{Key: kb.Key("log", id, true, region), Kind: limiter.KindLog, Windows: wins},
				{Key: kb.Global("log", id), Kind: limiter.KindLog, Global: true, Windows: global}}}
			if rng.IntN(8) == 0 && !(ph == allF1 && i < 2*len(ids)) {
				op.Mode = limiter.ModePeek
			}
			checkAgainstOracle(t, oracle, engines[nodes[node]][node%2], op, fmt.Sprintf("phase %d %v, node %d (%s), request %d", ph, nodes, node, nodes[node], i), seen)
		}
		if ph == allNew {
			// Every node writes format 3 now: the previous release, were it
			// still running, must fail on such a key, not read it as empty.
			op := &limiter.Op{Now: now, Cost: 1, Mode: limiter.ModeCheck, Parts: []limiter.Part{
				{Key: kb.Global("log", ids[0]), Kind: limiter.KindLog, Global: true, Windows: global}}}
			if oracle.count(op.Parts[0].Key, global[0].Len, now) == 0 {
				t.Fatalf("the key %s holds nothing in format 3 to try the previous release on", op.Parts[0].Key)
			}
			if r, err := old.Do(ctx, op); err == nil {
				t.Fatalf("the previous release read a format-3 key and answered %+v, want an error", r)
			}
		}
	}
	t.Logf("%v", seen)
	if seen["allowed"] < 100 || seen["denied"] < 50 || seen["peek"] < 50 {
		t.Errorf("too easy: %v", seen)
	}
	mixedCounters(t, old, newStore, func(key string) string {
		return srv.Client(t).HGet(context.Background(), key, limiter.WindowName(10*time.Second)+"w").Val()
	})
	mixedTokenBuckets(t, old, newStore, srv.Client(t))
}

// tokenPhases are mixedTokenBuckets's nodes, phase by phase: the previous
// release (old) and this one (new), through a rolling upgrade and back.
var tokenPhases = [][3]string{
	{"old", "old", "old"},
	{"new", "old", "old"}, {"new", "new", "old"}, {"new", "old", "new"}, {"new", "new", "new"},
	{"old", "new", "new"}, {"old", "old", "new"}, {"old", "new", "old"}, {"old", "old", "old"},
}

// mixedTokenBuckets runs TestMixedVersions's upgrade on token_bucket keys
// (one window of 80 s, limit 40, burst 6: a token every 2 s, then limit 80 and burst 4 by phase; costs 1 to 3,
// so an admission moves tat 2 to 6 s; some peeks and some count_only
// records, which go by decide), through tokenPhases: every reply must be
// the in-process store's (exact: no key read as empty, nothing admitted
// that it would not admit; where the previous release checks a state of
// another T or B, it rewrites the state even when it denies, which this
// release does only on a record, and the in-process store is made to do
// the same first: RewriteTokenStates), and after every request the key's TTL must
// reach past its tat + 0.5 s (tokenTTLs). This release's fast path
// moves the TTL only when its tat leaves a span of the window (tb_fast in
// lua/token_bucket.lua), trusting the expiry it set before only when the
// tat it reads is the one it wrote (marked); the previous release sets the
// TTL to its tat + 1 s on every write, so a node that trusted its own
// earlier expiry after the previous release wrote would leave the key to
// expire before its tat and refill the bucket early. The run must hold
// such turns: fast writes after the previous release's (which must move
// the TTL), and fast writes after fast ones in the same span (which leave
// it).
func mixedTokenBuckets(t *testing.T, old *oldEngine, newStore func(...limiter.RedisOption) limiter.Store, client *redis.Client) {
	engines := map[string][2]limiter.Store{ // by version, for even and odd nodes (FCALL, EVALSHA)
		"old": {old, old},
		"new": {newStore(), newStore(limiter.WithScripts(limiter.ScriptsEval))},
	}
	oracle := limiter.NewMemoryStore()
	kb, _ := limiter.NewKeyBuilder("upt:", "api")
	rng := rand.New(rand.NewPCG(29, 4))
	now := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC).UnixMicro()
	// The policy changes with the phase on every node at once (a reload:
	// limit 40 and burst 6, then limit 80, then burst 4), so keys written by
	// one release under one T and B are read by the other under another,
	// which rescales them (this release's fast path hands a key to decide
	// when its field p, which the previous release does not write, is
	// missing or says another T and B).
	wins := []limiter.Win{{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 40, Burst: 6},
		{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 80, Burst: 6},
		{Name: limiter.WindowName(80 * time.Second), Len: 80e6, Limit: 40, Burst: 4}}
	ctx := context.Background()
	seen := map[string]int{}
	last := map[string]string{} // a key's last writer: old, fast (this release's fast path) or decide
	ttls := newTokenTTLs(client)
	for ph, nodes := range tokenPhases {
		win := wins[ph%len(wins)]
		for i := range 150 {
			now += 50_000 + rng.Int64N(400_000)
			if rng.IntN(12) == 0 {
				now += 5e6 + rng.Int64N(10e6) // the bucket fills up
			}
			node := i % 3
			version := nodes[node]
			key := kb.Key("token", fmt.Sprint("id", rng.IntN(3)), true, "r0")
			op := &limiter.Op{Now: now, Cost: 1 + rng.Int64N(3), Mode: limiter.ModeCheck,
				Parts: []limiter.Part{{Key: key, Kind: limiter.KindToken, Windows: []limiter.Win{win}}}}
			switch rng.IntN(12) {
			case 0:
				op.Mode = limiter.ModePeek
			case 1:
				op.Mode = limiter.ModeRecord
			}
			where := fmt.Sprintf("phase %d %v, node %d (%s), request %d, %s", ph, nodes, node, version, i, key)
			rewrote := false
			if version == "old" && op.Mode != limiter.ModePeek {
				// The previous release rewrites a state written under
				// another T or B on every check but a peek (cost 0, at
				// most its full bucket), and answers as from the state
				// rewritten; this release, and so the in-process store,
				// only on a check that records, and a check that records
				// nothing answers from the state as written. The model
				// does to itself first what the previous release writes
				// to Redis, so that it answers as that release and goes
				// on holding what Redis holds. (On an admission or a
				// record the rewrite is the record's own first step: the
				// same either way. A peek of the previous release on such
				// a state answers as from it rewritten, writing nothing:
				// not modelled; this run has none, and one would fail
				// here, not pass unseen.)
				rewrote = limiter.RewriteTokenStates(oracle, cloneOp(op))
			}
			want, err := oracle.Do(ctx, cloneOp(op))
			if err != nil {
				t.Fatal(err)
			}
			r, err := engines[version][node%2].Do(ctx, cloneOp(op))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if r.Status != want.Status || len(r.Usage) != 1 || r.Usage[0] != want.Usage[0] {
				t.Fatalf("%s: %+v, the in-process store says %+v", where, r, want)
			}
			if rewrote && r.Status == limiter.StatusDenied {
				seen["old denial rewrote"]++
			}
			if r.Status == limiter.StatusAllowed && op.Mode != limiter.ModePeek {
				writer := version
				if version == "new" {
					writer = "decide"
					if op.Mode == limiter.ModeCheck {
						writer = "fast"
					}
				}
				if writer == "fast" && last[key] != "" {
					seen["fast after "+last[key]]++
				}
				last[key] = writer
				seen["allowed"]++
			} else if op.Mode == limiter.ModeCheck {
				seen["denied"]++
			}
			ttls.check(t, key, win.Name, now, where)
		}
	}
	t.Logf("token buckets: %v", seen)
	if seen["fast after old"] < 10 || seen["fast after fast"] < 20 || seen["fast after decide"] < 3 || seen["denied"] < 50 || seen["old denial rewrote"] < 3 {
		t.Errorf("too easy: %v", seen)
	}
}

// tokenTTLs holds token buckets' keys to their TTL: after every request a
// key that exists must expire past its window's tat + 0.5 s. Expiry is
// reckoned on the tests' clock, which moves faster than real time: when a
// request sets the key's TTL (its PEXPIRETIME changes), the key expires
// PTTL after that request's now, until a request sets it again. So that
// every TTL a request sets is seen to change it, even to the millisecond
// the key had, check moves the expiry it read to a mark of its own
// (PEXPIREAT 10^9 ms later: no script's TTL comes near it, and the key
// cannot expire in real time while a test runs). (Until 2026-12-03 it
// moved the expiry 1 ms earlier, which a TTL set a few milliseconds of
// real time later could meet exactly: a request that set the TTL was then
// taken for one that left it, seen when the policy began to change by
// phase in mixedTokenBuckets.) Redis 6 has no PEXPIRETIME: there the TTLs
// go unchecked (none set), and the replies alone are held to the
// in-process store.
type tokenTTLs struct {
	client *redis.Client
	set    map[string][2]int64 // by key: the mark check set as PEXPIRETIME (ms) and the expiry on the tests' clock (µs)
	none   bool                // the server has no PEXPIRETIME (Redis 6)
}

func newTokenTTLs(client *redis.Client) *tokenTTLs {
	return &tokenTTLs{client: client, set: map[string][2]int64{}}
}

func (w *tokenTTLs) check(t *testing.T, key, window string, now int64, where string) {
	t.Helper()
	ctx := context.Background()
	s, err := w.client.HGet(ctx, key, window+"t").Result()
	if err == redis.Nil {
		delete(w.set, key)
		return
	}
	tat, perr := strconv.ParseFloat(s, 64)
	if err != nil || perr != nil || tat != float64(int64(tat)) {
		t.Fatalf("%s: the bucket's tat %q: %v %v", where, s, err, perr)
	}
	if w.none {
		return
	}
	at, err := w.client.PExpireTime(ctx, key).Result()
	if err != nil && strings.Contains(err.Error(), "unknown command") {
		w.none = true
		t.Logf("no PEXPIRETIME (Redis 6): the token buckets' TTLs go unchecked")
		return
	}
	pttl := w.client.PTTL(ctx, key).Val()
	if err != nil || at <= 0 || pttl <= 0 {
		t.Fatalf("%s: PEXPIRETIME %v, PTTL %v: %v", where, at, pttl, err)
	}
	prev, ok := w.set[key]
	if !ok || prev[0] != at.Milliseconds() {
		// The request set the TTL (or the key is new to check).
		prev = [2]int64{at.Milliseconds() + 1e9, now + pttl.Microseconds()}
		if !w.client.PExpireAt(ctx, key, time.UnixMilli(prev[0])).Val() {
			t.Fatalf("%s: PEXPIREAT failed", where)
		}
		w.set[key] = prev
	}
	if prev[1] < int64(tat)+500_000 {
		t.Fatalf("%s: the key expires at %d µs, its tat is %d (%d µs from now): it could expire before its bucket is full",
			where, prev[1], int64(tat), int64(tat)-now)
	}
}

// counterPhases are mixedCounters's nodes, phase by phase: the previous
// release (old), this one under state_format 1 (f1), 2 (f2) and 3 (f3, the
// counter's JSON format 3, as the builds before format 4 write it), and as
// it comes (f4, the counter's format 4).
var counterPhases = [][3]string{
	{"old", "old", "old"},
	{"f1", "old", "old"}, {"f1", "f1", "old"}, {"f1", "f1", "f1"}, // the rolling upgrade, state_format 1
	{"f2", "f1", "f1"}, {"f3", "f2", "f1"}, {"f3", "f3", "f2"}, // state_format 2, then 3, node by node
	{"f4", "f3", "f3"}, {"f4", "f4", "f3"}, {"f4", "f4", "f4"}, {"f4", "f4", "f4"}, // then removed (format 4)
	{"f3", "f4", "f4"}, {"f3", "f3", "f4"}, {"f3", "f3", "f3"}, // rollback: state_format 3,
	{"f2", "f3", "f3"}, {"f2", "f2", "f3"}, {"f2", "f2", "f2"}, // then 2,
	{"f1", "f4", "f2"}, {"f1", "f1", "f2"}, {"f1", "f1", "f1"}, // then 1 (one node still in format 4),
	{"old", "f1", "f1"}, {"old", "old", "f1"}, {"old", "old", "old"}, // then the previous release
}

// mixedCounters runs TestMixedVersions's upgrade on sliding_counter keys (a
// bucket in one of two regions and the global ceiling, windows of 10 s and
// 30 s) through counterPhases: the previous release's two counters (format
// 1), this release's 10 buckets (format 2, state_format 2) and its 20
// buckets with their first and last arrivals (format 3 in JSON,
// state_format 3; format 4 in fixed-width slots, the same model), each node
// reading every format and writing its own. The counter is an estimate, so what each
// reply must be is a bound of the exact log, not the log:
//   - while every node reads and writes format 1 (phases 0-3), exactly the
//     previous release's two-counter estimate from the log (the new
//     release's state_format 1 decides as the old one did);
//   - never read as empty: every window's count at least the units the
//     log holds since both the current fixed window and the window's
//     first bucket of format 2 (t - L + L/10) started, which every format
//     counts whole;
//   - never more admitted in a window (t - L, t] than twice the limit (the
//     two counters' own bound) if a node in format 1 served a request in
//     it, else than format 2's limit + ceil(limit / 10) if a node in format
//     2 did, else than formats 3's and 4's limit + ceil(limit / 20) - 1.
//
// Once every node writes format 4, the previous release fails on a key in
// it (an error, not a key read as empty; TestCounterFormat4FailsFormat3
// holds the builds of format 3 to the same).
func mixedCounters(t *testing.T, old *oldEngine, newStore func(...limiter.RedisOption) limiter.Store, field10s func(key string) string) {
	f1, f2 := limiter.WithStateFormat(limiter.LogFormat1), limiter.WithStateFormat(limiter.LogFormat2)
	f3 := limiter.WithStateFormat(limiter.CounterFormat3)
	eval := limiter.WithScripts(limiter.ScriptsEval)
	engines := map[string][2]limiter.Store{ // by version, for even and odd nodes (FCALL, EVALSHA)
		"old": {old, old},
		"f1":  {newStore(f1), newStore(f1, eval)},
		"f2":  {newStore(f2), newStore(f2, eval)},
		"f3":  {newStore(f3), newStore(f3, eval)},
		"f4":  {newStore(), newStore(eval)},
	}
	kb, _ := limiter.NewKeyBuilder("upc:", "api")
	rng := rand.New(rand.NewPCG(29, 3))
	oracle := upgradeOracle{}
	now := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC).UnixMicro()
	wins := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10e6, Limit: 8},
		{Name: limiter.WindowName(30 * time.Second), Len: 30e6, Limit: 20}}
	global := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10e6, Limit: 12}}
	ctx := context.Background()
	seen := map[string]int{}
	ids := []string{"id0", "id1", "id2", "id3"}
	last := map[string]int64{} // the last request a node of each format served
	allF1 := 19                // the phase every node of this release writes format 1 in, before the previous release comes back
	for ph, nodes := range counterPhases {
		for i := range 80 {
			now += rng.Int64N(300_000)
			node := i % 3
			id := ids[rng.IntN(len(ids))]
			region := fmt.Sprint("r", rng.IntN(2))
			if ph == allF1 && i < 2*len(ids) {
				// Before the previous release comes back, every key is
				// checked by a node writing format 1.
				id, node, region = ids[i/2], 0, fmt.Sprint("r", i%2)
			}
			op := &limiter.Op{Now: now, Cost: 1 + rng.Int64N(3), Mode: limiter.ModeCheck, Parts: []limiter.Part{
				{Key: kb.Key("ctr", id, true, region), Kind: limiter.KindCounter, Windows: wins},
				{Key: kb.Global("ctr", id), Kind: limiter.KindCounter, Global: true, Windows: global}}}
			if rng.IntN(8) == 0 && !(ph == allF1 && i < 2*len(ids)) {
				op.Mode = limiter.ModePeek
			}
			where := fmt.Sprintf("counter phase %d %v, node %d (%s), request %d", ph, nodes, node, nodes[node], i)
			r, err := engines[nodes[node]][node%2].Do(ctx, cloneOp(op))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			format := map[string]string{"old": "f1", "f1": "f1", "f2": "f2", "f3": "f3", "f4": "f3"}[nodes[node]]
			last[format] = now
			admitted := r.Status == limiter.StatusAllowed
			if ph <= 3 {
				fits := true
				for _, p := range op.Parts {
					for _, w := range p.Windows {
						if oldCounterEst(oracle[p.Key], w.Len, op.Now)+op.Cost*w.Len > w.Limit*w.Len {
							fits = false
						}
					}
				}
				if admitted != fits {
					t.Fatalf("%s: admitted %v, the two counters say %v (%+v)", where, admitted, fits, r)
				}
			}
			if admitted && op.Mode == limiter.ModeCheck {
				for _, p := range op.Parts {
					oracle[p.Key] = append(oracle[p.Key], [2]int64{op.Now, op.Cost})
				}
			}
			j := 0
			for _, p := range op.Parts {
				for _, w := range p.Windows {
					since := max(op.Now/w.Len*w.Len, op.Now-w.Len+w.Len/10)
					if least := oracle.count(p.Key, op.Now-since+1, op.Now); r.Usage[j].Count < least {
						t.Fatalf("%s: %s window %d s counts %d, below the %d units since %d µs ago (%+v)", where, p.Key, w.Len/1e6, r.Usage[j].Count, least, op.Now-since, r)
					}
					bound := w.Limit + (w.Limit+19)/20 - 1
					if last["f1"] > op.Now-w.Len {
						bound = 2 * w.Limit
					} else if last["f2"] > op.Now-w.Len {
						bound = w.Limit + (w.Limit+9)/10
					}
					if n := oracle.count(p.Key, w.Len, op.Now); n > bound {
						t.Fatalf("%s: %s window %d s holds %d units, over %d", where, p.Key, w.Len/1e6, n, bound)
					}
					j++
				}
			}
			switch {
			case op.Mode == limiter.ModePeek:
				seen["peek"]++
			case admitted:
				seen["allowed"]++
			default:
				seen["denied"]++
			}
		}
		if ph == 10 {
			key := kb.Global("ctr", ids[0])
			if v := field10s(key); !strings.HasPrefix(v, "[3,#4") {
				t.Fatalf("phase %d: the key %s holds %.40q, want format 4", ph, key, v)
			}
			op := &limiter.Op{Now: now, Cost: 1, Mode: limiter.ModeCheck, Parts: []limiter.Part{
				{Key: key, Kind: limiter.KindCounter, Global: true, Windows: global}}}
			if r, err := old.Do(ctx, op); err == nil {
				t.Fatalf("the previous release read a format-4 counter key and answered %+v, want an error", r)
			}
		}
	}
	t.Logf("counter: %v", seen)
	if seen["allowed"] < 100 || seen["denied"] < 50 || seen["peek"] < 50 {
		t.Errorf("counter: too easy: %v", seen)
	}
}

// oldCounterEst is the previous release's two-counter estimate of a window
// of length w at now from a log, times w: p*(w-e) + c*w for the units c
// of the fixed window now is in and p of the one before.
func oldCounterEst(log [][2]int64, w, now int64) int64 {
	idx := now / w
	var c, p int64
	for _, e := range log {
		switch e[0] / w {
		case idx:
			c += e[1]
		case idx - 1:
			p += e[1]
		}
	}
	return p*(w-(now-idx*w)) + c*w
}

// checkAgainstOracle runs op on s and holds its reply to the exact log,
// then records it there when admitted.
func checkAgainstOracle(t *testing.T, oracle upgradeOracle, s limiter.Store, op *limiter.Op, where string, seen map[string]int) {
	t.Helper()
	fits := true
	for _, p := range op.Parts {
		for _, w := range p.Windows {
			if oracle.count(p.Key, w.Len, op.Now)+op.Cost > w.Limit {
				fits = false
			}
		}
	}
	r, err := s.Do(context.Background(), cloneOp(op))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if got := r.Status == limiter.StatusAllowed; got != fits {
		t.Fatalf("%s: admitted %v, the exact log says %v (%+v)", where, got, fits, r)
	}
	record := fits && op.Mode == limiter.ModeCheck
	j := 0
	for _, p := range op.Parts {
		for _, w := range p.Windows {
			want := oracle.count(p.Key, w.Len, op.Now)
			if record {
				want += op.Cost
			}
			if r.Usage[j].Count != want {
				t.Fatalf("%s: %s window %d s counts %d, the exact log %d (%+v)", where, p.Key, w.Len/1e6, r.Usage[j].Count, want, r)
			}
			j++
		}
	}
	if record {
		for _, p := range op.Parts {
			oracle[p.Key] = append(oracle[p.Key], [2]int64{op.Now, op.Cost})
		}
	}
	switch {
	case op.Mode == limiter.ModePeek:
		seen["peek"]++
	case fits:
		seen["allowed"]++
	default:
		seen["denied"]++
	}
}

// TestLogEntryCapInBothFormats: a log holds at most MaxLogEntries requests
// in its window whatever units are left, in either state format (their
// members before the first entry differ: "#n" and "#t", or "#2") and in
// the in-process store: with a limit of 20,000 a minute, 10,000 requests
// of cost 1 fill the log, the next is denied until the oldest leaves, and
// a request once it has left is admitted.
func TestLogEntryCapInBothFormats(t *testing.T) {
	t.Parallel()
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, s := range []struct {
		name  string
		store limiter.Store
	}{{"format 2", limiter.NewRedisStore(client)}, {"format 1", limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.LogFormat1))},
		{"memory", limiter.NewMemoryStore()}} {
		key := "cap:{" + s.name + "}"
		now := t0.UnixMicro()
		for i := range limiter.MaxLogEntries {
			r, err := s.store.Do(ctx, logOp(key, time.Minute, 20000, now+int64(i)))
			if err != nil || r.Status != limiter.StatusAllowed {
				t.Fatalf("%s: request %d: %+v %v", s.name, i+1, r, err)
			}
		}
		at := now + limiter.MaxLogEntries + 5
		r, err := s.store.Do(ctx, logOp(key, time.Minute, 20000, at))
		if err != nil || r.Status != limiter.StatusDenied || r.Usage[0].Count != limiter.MaxLogEntries ||
			r.Usage[0].Retry != now+time.Minute.Microseconds()-at {
			t.Fatalf("%s: request %d: %+v %v, want denied at count %d until the oldest leaves", s.name, limiter.MaxLogEntries+1, r, err, limiter.MaxLogEntries)
		}
		r, err = s.store.Do(ctx, logOp(key, time.Minute, 20000, now+time.Minute.Microseconds()))
		if err != nil || r.Status != limiter.StatusAllowed || r.Usage[0].Count != limiter.MaxLogEntries {
			t.Fatalf("%s: once the oldest left: %+v %v, want admitted at count %d", s.name, r, err, limiter.MaxLogEntries)
		}
	}
}

// TestLogTTLAcrossFormats: a key turned from state format 1 into format 2
// by a check that denies (and so writes no entry) takes format 2's TTL, so
// that a later admission in the newest entry's span, which leaves the TTL,
// still has the key live until its entry leaves the window.
func TestLogTTLAcrossFormats(t *testing.T) {
	t.Parallel()
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	f1, f2 := limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.LogFormat1)), limiter.NewRedisStore(client)
	key := "ttl:{" + randomID(t) + "}"
	span := time.Minute.Microseconds() / 8
	at := t0.UnixMicro()/span*span + 1 // the start of a span
	do := func(s limiter.Store, cost, dt int64, want limiter.Status) {
		op := logOp(key, time.Minute, 2, at+dt)
		op.Cost = cost
		if r, err := s.Do(ctx, op); err != nil || r.Status != want {
			t.Fatalf("cost %d at +%d µs: %+v %v, want status %v", cost, dt, r, err, want)
		}
	}
	do(f1, 1, 0, limiter.StatusAllowed)         // format 1, its TTL the window + 1 s
	do(f2, 2, 1_000_000, limiter.StatusDenied)  // turned into format 2
	do(f2, 1, 2_000_000, limiter.StatusAllowed) // the newest entry's span: the TTL is left
	need := time.Minute + 2*time.Second         // the last entry's window, from the first write, and 1 s
	if ttl := client.PTTL(ctx, key).Val(); ttl < need {
		t.Errorf("the log's TTL is %v, want at least %v (its newest entry's window and a second)", ttl, need)
	}
}
