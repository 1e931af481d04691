package limiter

import (
	"testing"
	"time"
)

// TestOpShapeSeesWhatChangesTheAnswer: ops that differ in anything that
// changes a store's answer have different shapes; the time does not count,
// nor a calendar period's bounds, which are the time's (a denial holds into
// the next period until its retry time).
func TestOpShapeSeesWhatChangesTheAnswer(t *testing.T) {
	t.Parallel()
	base := func() *Op {
		return &Op{Mode: ModeCheck, Now: 1, Cost: 1,
			Parts: []Part{{Key: "rl:{a}:log", Kind: KindLog, Windows: []Win{{Name: "60000000", Len: 60e6, Limit: 10}}}},
			Ban:   &BanOp{Key: "rl:{a}:ban", After: 3, Within: 60e6, For: 600e6},
			Lease: &LeaseOp{Key: "rl:{a}:lease", Max: 2, Timeout: 30e6, ID: "x"}}
	}
	want := opShape(base())
	same := base()
	same.Now, same.Deadline, same.Lease.ID = 99, time.Now(), "y"
	same.Parts[0].Windows[0].Bounds = [4]int64{1, 5, 9, 13}
	if opShape(same) != want {
		t.Error("the time, the deadline, a calendar period's bounds or the lease's id changed the shape")
	}
	seen := map[uint64]string{want: "base"}
	for name, change := range map[string]func(*Op){
		"mode": func(o *Op) { o.Mode = ModeCheckOnly }, "cost": func(o *Op) { o.Cost = 2 },
		"key": func(o *Op) { o.Parts[0].Key = "rl:{b}:log" }, "key's tail": func(o *Op) { o.Parts[0].Key = "rl:{a}:lox" },
		"key's length": func(o *Op) { o.Parts[0].Key = "rl:{a}:log\x00" }, "key's word": func(o *Op) { o.Parts[0].Key = "rl:{a}:Log" }, "kind": func(o *Op) { o.Parts[0].Kind = KindCounter },
		"name": func(o *Op) { o.Parts[0].Windows[0].Name = "60000001" }, "limit": func(o *Op) { o.Parts[0].Windows[0].Limit = 11 },
		"burst":   func(o *Op) { o.Parts[0].Windows[0].Burst = 1 },
		"ban key": func(o *Op) { o.Ban.Key = "rl:{b}:ban" }, "ban after": func(o *Op) { o.Ban.After = 4 },
		"ban within": func(o *Op) { o.Ban.Within = 1 }, "ban for": func(o *Op) { o.Ban.For = 1 },
		"no ban": func(o *Op) { o.Ban = nil }, "lease max": func(o *Op) { o.Lease.Max = 3 },
		"lease timeout": func(o *Op) { o.Lease.Timeout = 1 }, "no lease": func(o *Op) { o.Lease = nil },
		"limit and cost":          func(o *Op) { o.Parts[0].Windows[0].Limit, o.Cost = 1<<40, 1<<20 },
		"an override read":        func(o *Op) { o.Override = &OverrideRef{Key: "rl:{a}:ov"} },
		"an override of a region": func(o *Op) { o.Override = &OverrideRef{Key: "rl:{a}:ov", Scope: "eu"} },
	} {
		op := base()
		change(op)
		s := opShape(op)
		if prev, dup := seen[s]; dup {
			t.Errorf("%s: the same shape as %s", name, prev)
		}
		seen[s] = name
	}
}
