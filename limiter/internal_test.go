package limiter

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// TestBatchKeepsEachChecksDeadline: a batch holds a check with a short
// deadline and one without. Redis is slow for a while: the check without a
// deadline gets its answer when Redis answers, not its neighbour's
// deadline error.
func TestBatchKeepsEachChecksDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client)
	b := newBatcher(s, 1, 8)
	t.Cleanup(b.close)
	w := b.newWorker()
	t.Cleanup(w.ctx.close)
	op := func(ctx context.Context, key string) *batchOp {
		o := &batchOp{ctx: ctx, done: make(chan struct{}, 1)}
		o.until, _ = ctx.Deadline()
		o.c.encode(&Op{Cost: 1, Parts: []Part{{Key: key, Kind: KindLog,
			Windows: []Win{{Name: WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 5}}}}}, 0, 0)
		return o
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	short, open := op(ctx, "t:{short}"), op(context.Background(), "t:{open}")

	sleeper := srv.Client(t)
	go sleeper.Do(context.Background(), "DEBUG", "SLEEP", "0.5")
	time.Sleep(50 * time.Millisecond) // Redis is asleep
	began := time.Now()
	w.run([]*batchOp{short, open})
	<-open.done
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Fatalf("the batch took %s: Redis was not asleep, the test shows nothing", took)
	}
	if open.err != nil {
		t.Fatalf("the check without a deadline failed with its neighbour's: %v", open.err)
	}
	if _, err := s.reply(open.vals, open.time, &Op{Parts: []Part{{Windows: make([]Win, 1)}}}, time.Now()); err != nil {
		t.Fatalf("its reply: %v", err)
	}
}

// TestMemoryStoreIsBounded: a store bounded to 640 keys holds at most that
// many, however many identities come, and counts what it evicted.
func TestMemoryStoreIsBounded(t *testing.T) {
	t.Parallel()
	s := NewMemoryStore(WithMaxKeys(640))
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	now := time.Now().UnixMicro()
	for i := 0; i < 20000; i++ {
		op := &Op{Now: now, Cost: 1, Parts: []Part{{Key: "t:{" + strconv.Itoa(i) + "}", Kind: KindFixed,
			Windows: []Win{{Name: WindowName(time.Hour), Len: time.Hour.Microseconds(), Limit: 5}}}}}
		if _, err := s.Do(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > 640 || n < 320 {
		t.Fatalf("%d keys held, bound 640", n)
	}
	if e := s.Evictions(); e < 20000-640 {
		t.Fatalf("%d evictions for 20000 keys over a bound of 640", e)
	}
}

// TestMemoryExpiryIsIncremental: expired keys go without a sweep that walks
// every key: one janitor pass over a shard drops at most 16 samples of 20,
// and passes keep going until they are gone; live keys stay.
func TestMemoryExpiryIsIncremental(t *testing.T) {
	t.Parallel()
	s := NewMemoryStore()
	t.Cleanup(func() { s.Close() })
	sh := &s.shards[0]
	past := time.Now().Add(-time.Second).UnixNano()
	future := time.Now().Add(time.Hour).UnixNano()
	sh.mu.Lock()
	for i := 0; i < 5000; i++ {
		sh.m["old:"+strconv.Itoa(i)] = &memKey{wall: past}
	}
	for i := 0; i < 100; i++ {
		sh.m["live:"+strconv.Itoa(i)] = &memKey{wall: future}
	}
	sh.mu.Unlock()
	s.expireSome(sh)
	sh.mu.Lock()
	left := len(sh.m)
	sh.mu.Unlock()
	if dropped := 5100 - left; dropped == 0 || dropped > 16*20 {
		t.Fatalf("one pass dropped %d keys, want 1..320", dropped)
	}
	for pass := 0; pass < 1000; pass++ {
		s.expireSome(sh)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.m) != 100 {
		t.Fatalf("%d keys left after the passes, want the 100 live ones", len(sh.m))
	}
}

// TestCtrSlot holds ctrSlot to Lua's m % (N + 1), a - floor(a / b) * b, on
// bucket indexes from 0 to past today's µs clock over the shortest bucket.
func TestCtrSlot(t *testing.T) {
	lua := func(a float64) int { return int(a - math.Floor(a/ctrSlots)*ctrSlots) }
	ms := []float64{0, 1, 20, 21, 22, 1<<31 - 1, 1 << 31, 1<<53 - 1, 1 << 53, -1, -21, -22}
	for m := 1.7e15; m < 1.7e15+200; m++ {
		ms = append(ms, m)
	}
	for _, m := range ms {
		if got, want := ctrSlot(m), lua(m); got != want {
			t.Errorf("ctrSlot(%.0f) = %d, Lua's %% gives %d", m, got, want)
		}
	}
}

// TestCallDeadlinesAndTime: the checks of one call send their deadlines
// and nows relative to the call's bases (one below the earliest), and the
// call's reading of Redis TIME comes once, after the checks' replies: a
// check past its deadline is late and the others of its call, whose
// deadlines are later, none (0) or none but read TIME (-1), run, whether
// the call goes by FCALL, by the kind's fast script or by the full script,
// each at its own now (clock app: the reset of its fixed window, the score
// of its log's entry) or at the call's TIME (0 sent); each reply's now is
// that one. A call holding a log's check of the fast form in format 3 sends
// its nows whole. A check alone (Do) sends its own bases.
func TestCallDeadlinesAndTime(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	redisNow := func() int64 {
		tm, err := client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	minute := Win{Name: WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 5}
	// op is check i of a call of the given form, on keys under ns:
	// fixed_window's fast form; in a mixed call, a log of two windows
	// (decide's path) for odd i; in a log3 call, a log of one window (the
	// fast form of format 3) for odd i.
	op := func(ns, form string, i int, now int64) *Op {
		o := &Op{Now: now, Cost: 1, Parts: []Part{{Key: ns + ":{t}:" + strconv.Itoa(i), Kind: KindFixed, Windows: []Win{minute}}}}
		if i%2 == 1 && form != "fixed" {
			o.Parts[0].Kind = KindLog
			if form == "mixed" {
				o.Parts[0].Windows = append(o.Parts[0].Windows, Win{Name: WindowName(time.Hour), Len: time.Hour.Microseconds(), Limit: 9})
			}
		}
		return o
	}
	for name, opts := range map[string][]RedisOption{"fcall": nil, "evalsha": {WithScripts(ScriptsEval)}} {
		s := NewRedisStore(client, opts...)
		b := newBatcher(s, 1, 16)
		w := b.newWorker()
		for _, form := range []string{"fixed", "mixed", "log3"} {
			rnow := redisNow()
			ns := name + ":" + form
			deadlines := []int64{rnow + 60e6, 0, rnow - 1e6, -1, rnow + 30e6, rnow - 2e6, rnow + 45e6, 0}
			late := map[int]bool{2: true, 5: true}
			var ops []*Op
			var bops []*batchOp
			for i, d := range deadlines {
				now := rnow + 1000*int64(i) - 5000
				if i%3 == 0 {
					now = 0 // Redis's clock
				}
				ops = append(ops, op(ns, form, i, now))
				bo := &batchOp{ctx: ctx, done: make(chan struct{}, 1)}
				bo.c.encode(ops[i], d, 0)
				bops = append(bops, bo)
			}
			w.run(bops)
			if whole := w.base[1] == 0; whole != (form == "log3") {
				t.Errorf("%s: the call's base of nows %d", ns, w.base[1])
			}
			for i, bo := range bops {
				<-bo.done
				if bo.err != nil {
					t.Fatalf("%s, check %d: %v", ns, i, bo.err)
				}
				if bo.time < rnow {
					t.Errorf("%s, check %d: the call's time %d, want Redis TIME (from %d)", ns, i, bo.time, rnow)
				}
				r, err := s.reply(bo.vals, bo.time, ops[i], time.Now())
				if late[i] {
					if err != ErrLate {
						t.Errorf("%s, check %d (deadline %d µs from TIME): %+v %v, want late", ns, i, deadlines[i]-rnow, r, err)
					}
					continue
				}
				now := ops[i].Now
				if now == 0 {
					now = bo.time
				}
				if err != nil || r.Status != StatusAllowed || r.Now != now || r.Usage[0].Count != 1 {
					t.Fatalf("%s, check %d (deadline %d): %+v %v, want admitted at %d", ns, i, deadlines[i], r, err, now)
				}
				p := ops[i].Parts[0]
				if p.Kind == KindFixed {
					if want := minute.Len - now%minute.Len; r.Usage[0].Reset != want {
						t.Errorf("%s, check %d: reset %d, want %d (the window's end from %d)", ns, i, r.Usage[0].Reset, want, now)
					}
					continue
				}
				// A log's entry (format 3) is scored -at, its time.
				zs := client.ZRangeWithScores(ctx, p.Key, 0, -1).Val()
				if len(zs) != 2 || int64(zs[0].Score) != -now {
					t.Errorf("%s, check %d: the log holds %v, want an entry at %d", ns, i, zs, -now)
				}
			}
		}
		// A call of no deadline reads no TIME; one that asks for it (-1)
		// and has none does.
		for _, asks := range []bool{false, true} {
			rnow := redisNow()
			var bops []*batchOp
			for i := range 3 {
				bo := &batchOp{ctx: ctx, done: make(chan struct{}, 1)}
				d := int64(0)
				if asks && i == 1 {
					d = -1
				}
				bo.c.encode(op(name+":none:"+strconv.FormatBool(asks), "fixed", i, rnow+int64(i)), d, 0)
				bops = append(bops, bo)
			}
			w.run(bops)
			for i, bo := range bops {
				<-bo.done
				if bo.err != nil || (bo.time >= rnow) != asks || (bo.time == 0) == asks {
					t.Errorf("%s, a call asking for TIME %v, check %d: time %d %v", name, asks, i, bo.time, bo.err)
				}
			}
		}
		o := op(name+":alone", "fixed", 0, 0)
		o.Deadline = time.Now().Add(time.Minute)
		before := redisNow()
		if r, err := s.Do(ctx, o); err != nil || r.Status != StatusAllowed || r.Now < before || r.Now > redisNow() {
			t.Errorf("%s alone: %+v %v, want admitted at Redis's time", name, r, err)
		}
		o = op(name+":alone", "fixed", 1, before-3e6)
		o.Deadline = time.Now().Add(time.Minute)
		if r, err := s.Do(ctx, o); err != nil || r.Status != StatusAllowed || r.Usage[0].Reset != minute.Len-o.Now%minute.Len {
			t.Errorf("%s alone at %d: %+v %v, want admitted, reset from then", name, o.Now, r, err)
		}
		b.close()
		w.ctx.close()
		s.Close()
	}
}

// TestCallErrorsAreTheirChecks: in a call of several checks, a check that
// fails (a key of the wrong type) answers its error alone, wherever it
// stands, and the checks after it run on their own values and keys, whether
// the call goes by FCALL, by the kind's fast script or by the full one; a
// shape Redis cannot read fails the whole call.
func TestCallErrorsAreTheirChecks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	minute := Win{Name: WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 20}
	for name, opts := range map[string][]RedisOption{"fcall": nil, "evalsha": {WithScripts(ScriptsEval)}} {
		s := NewRedisStore(client, opts...)
		b := newBatcher(s, 1, 16)
		w := b.newWorker()
		for _, mixed := range []bool{false, true} {
			ns := name + ":" + strconv.FormatBool(mixed) + ":{t}:"
			bad := map[int]bool{0: true, 2: true, 5: true}
			for i := range bad {
				client.Set(ctx, ns+strconv.Itoa(i), "x", 0)
			}
			for round := range 2 {
				var ops []*Op
				var bops []*batchOp
				for i := range 6 {
					o := &Op{Now: time.Now().UnixMicro(), Cost: int64(i + 1), Parts: []Part{{Key: ns + strconv.Itoa(i), Kind: KindFixed, Windows: []Win{minute}}}}
					if mixed && i%2 == 1 {
						o.Parts[0].Kind = KindLog
						o.Parts[0].Windows = append(o.Parts[0].Windows, Win{Name: WindowName(time.Hour), Len: time.Hour.Microseconds(), Limit: 40})
						o.Ban = &BanOp{Key: ns + strconv.Itoa(i) + ":ban", After: 3, Within: 10e6, For: 60e6}
					}
					ops = append(ops, o)
					bo := &batchOp{ctx: ctx, done: make(chan struct{}, 1)}
					bo.c.encode(o, 0, 0)
					bops = append(bops, bo)
				}
				w.run(bops)
				for i, bo := range bops {
					<-bo.done
					r, err := bo.err, error(nil)
					if r == nil {
						var rep Reply
						rep, err = s.reply(bo.vals, bo.time, ops[i], time.Now())
						if err == nil && (rep.Status != StatusAllowed || rep.Usage[0].Count != int64((round+1)*(i+1))) {
							err = fmt.Errorf("%+v", rep)
						}
					}
					if bad[i] != (r != nil) || bad[i] && !strings.Contains(r.Error(), "WRONGTYPE") || err != nil {
						t.Errorf("%s, round %d, check %d: %v %v, want %s", ns, round, i, r, err,
							map[bool]string{true: "WRONGTYPE", false: "admitted with count (round+1)*cost"}[bad[i]])
					}
				}
			}
		}
		b.close()
		w.ctx.close()
		s.Close()
	}
	shape := `[0,1,1,0,0,0,3,1,0,"60000000",60000000,5,0]`
	err := client.Do(ctx, "FCALL", lua.DecideFunction, 2, "e:{t}:1", "e:{t}:2", 2, 0, 0, shape, 1e15, 0, "[0,1", 1e15, 0).Err()
	if err == nil || !strings.Contains(err.Error(), "Expected comma or array end") {
		t.Errorf("a call with a shape Redis cannot read: %v, want its decoding error", err)
	}
}

// indexHook is an in-process store whose override index runs before, just
// ahead of each write of a member (SetOverride's).
type indexHook struct {
	*MemoryStore
	before atomic.Pointer[func()] // set once the limiter is built: its watcher reads the index meanwhile
}

func (h *indexHook) overrideIndex(ctx context.Context, index, member string, now, until int64) (map[string]int64, int64, error) {
	if f := h.before.Load(); member != "" && until > 0 && f != nil {
		(*f)()
	}
	return h.MemoryStore.overrideIndex(ctx, index, member, now, until)
}

// TestSetOverrideSurvivesAnIndexReadAmidIt: a read of the index of live
// overrides begins after SetOverride marked the identity as having one and
// reads the index before SetOverride wrote it there (the node's watcher,
// its first read late under a busy machine). The node must still know of
// the override when SetOverride returns: its requests read it, and are
// held to it. Before, the read dropped the identity (learnt before the
// read began, gone from the index), and its third request under an
// override of 2 was admitted under the limit of 100 (seen once in
// TestOverrideEndBoundsWhatWasDecidedUnderIt under two busy loops).
func TestSetOverrideSurvivesAnIndexReadAmidIt(t *testing.T) {
	t.Parallel()
	ms := NewMemoryStore()
	t.Cleanup(func() { ms.Close() })
	h := &indexHook{MemoryStore: ms}
	l, err := New(Policy{Name: "ovrace", Windows: []Window{{Duration: time.Hour}}},
		Backend{Store: h, Source: SourceMemory, Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	read := l.readIndex
	h.before.Store(&read)
	ctx := context.Background()
	if _, err := l.SetOverride(ctx, "K", Override{Limits: []int64{2}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if !l.KnowsOverride("K") {
		t.Fatal("after SetOverride the node does not know K has an override")
	}
	in := Input{Identity: "K", Limits: []int64{100}}
	admitted := 0
	for range 3 {
		if d, _ := l.Decide(ctx, &in); d.Pass {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("K admitted %d of 3 under its override of 2", admitted)
	}
}
