package limiter

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestBatchOfEveryShape: one script call holds checks of every shape (a
// check's shape says how many values and keys it has: calendar periods with
// their bounds, a share's lead, claim and signature, a lease's id, an
// override's scope, a ban's key, several parts, the one-window fast path),
// and each check answers exactly as it does alone, on keys of its own, in
// two rounds (the second meets what the first recorded).
func TestBatchOfEveryShape(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	for name, opts := range map[string][]RedisOption{"fcall": nil, "evalsha": {WithScripts(ScriptsEval)}} {
		t.Run(name, func(t *testing.T) { batchOfEveryShape(t, NewRedisStore(client, opts...), name) })
	}
}

func batchOfEveryShape(t *testing.T, s *RedisStore, name string) {
	b := newBatcher(s, 1, 16)
	t.Cleanup(b.close)
	w := b.newWorker()
	t.Cleanup(w.ctx.close)

	now := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC).UnixMicro()
	hour, day := time.Hour.Microseconds(), 24*time.Hour.Microseconds()
	h0, d0 := now-now%hour-hour, now-now%day-day
	minute := func(limit int64) Win {
		return Win{Name: WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: limit}
	}
	second := Win{Name: WindowName(time.Second), Len: time.Second.Microseconds(), Limit: 2}
	// ops are the checks of one call, on keys under ns.
	ops := func(ns string) []*Op {
		k := func(s string) string { return ns + ":{t}:" + s }
		return []*Op{
			{Cost: 1, Parts: []Part{{Key: k("cal"), Kind: KindCalendar, Windows: []Win{
				{Name: "hour", Limit: 3, Bounds: [4]int64{h0, h0 + hour, h0 + 2*hour, h0 + 3*hour}},
				{Name: "day", Limit: 5, Bounds: [4]int64{d0, d0 + day, d0 + 2*day, d0 + 3*day}}}}}},
			{Cost: 1, Parts: []Part{{Key: k("log"), Kind: KindLog, Windows: []Win{minute(5)}}}},
			{Cost: 1, Parts: []Part{{Key: k("share"), Kind: KindShare, Global: true, Windows: []Win{minute(4)},
				Lead: 1000, Claim: 2000000, Sig: "sig"}}},
			{Cost: 2, Parts: []Part{{Key: k("fixed"), Kind: KindFixed, Windows: []Win{minute(3)}}}},
			{Cost: 1, Lease: &LeaseOp{Key: k("lease"), Max: 1, Timeout: 5000000, ID: "id-" + ns},
				Parts: []Part{{Key: k("log2"), Kind: KindLog, Windows: []Win{second, minute(4)}}}},
			{Cost: 1, Override: &OverrideRef{Key: k("ov"), Scope: "us"},
				Parts: []Part{{Key: k("token"), Kind: KindToken, Windows: []Win{{Name: WindowName(time.Minute),
					Len: time.Minute.Microseconds(), Limit: 6, Burst: 2}}}}},
			{Cost: 3, Ban: &BanOp{Key: k("ban"), After: 1, Within: 10000000, For: 60000000}, // refused: banned
				Parts: []Part{{Key: k("ctr"), Kind: KindCounter, Windows: []Win{second}},
					{Key: k("fixed2"), Kind: KindFixed, Windows: []Win{minute(1)}}}},
			{Cost: 1, Parts: []Part{{Key: k("token2"), Kind: KindToken, Windows: []Win{minute(2)}}}},
		}
	}
	ctx := context.Background()
	for round := range 2 {
		alone, batched := ops(name+":alone"), ops(name+":batched")
		var want []Reply
		for i, op := range alone {
			op.Now = now + int64(round)*1000
			r, err := s.Do(ctx, op)
			if err != nil {
				t.Fatalf("round %d, check %d alone: %v", round, i, err)
			}
			want = append(want, r)
		}
		bops := make([]*batchOp, len(batched))
		for i, op := range batched {
			op.Now = now + int64(round)*1000
			bops[i] = &batchOp{ctx: ctx, done: make(chan struct{}, 1)}
			bops[i].c.encode(op, 0, 0)
		}
		w.run(bops)
		for i, bo := range bops {
			<-bo.done
			if bo.err != nil {
				t.Fatalf("round %d, check %d in the call: %v", round, i, bo.err)
			}
			got, err := s.reply(bo.vals, bo.time, batched[i], time.Now())
			if err != nil {
				t.Fatalf("round %d, check %d in the call: %v", round, i, err)
			}
			got.Now, want[i].Now = 0, 0
			if !reflect.DeepEqual(got, want[i]) {
				t.Errorf("round %d, check %d in the call: %+v, alone %+v", round, i, got, want[i])
			}
		}
	}
}
