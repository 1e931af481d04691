package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestDryRunChangesNoEnforcingDecision: a dry-run canary and an enforcing
// node of one limiter share a store (and a later config drops dry_run on
// the canary). K, limited to 3 a minute with a ban after 2 refusals, sends
// 6 requests to the canary: all pass, the last 3 as would-be refusals, and
// the canary reports its would-be ban. The enforcing node (and the config
// that enforces later) then decides K exactly as if the canary's requests
// had been decided by an enforcing limiter that never banned: the 3
// admitted units are there (a dry run records what it admits), K is
// limited, not banned.
func TestDryRunChangesNoEnforcingDecision(t *testing.T) {
	t.Parallel()
	for _, be := range overrideStacks(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := be.open(t)
			clock := &testClock{t: t0.Add(2 * time.Second)}
			p := limiter.Policy{Name: "canary", KeyPrefix: randomID(t) + ":", Windows: []limiter.Window{{Duration: time.Minute}},
				AppClock: true, Now: clock.Now, Timeout: 5 * time.Second, Ban: &limiter.Ban{After: 2, Within: time.Minute, For: time.Hour}}
			enforcing, err := limiter.New(p, b)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(enforcing.Close)
			p.DryRun = true
			canary, err := limiter.New(p, b)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(canary.Close)
			ctx := context.Background()
			k := limiter.Input{Identity: "K", Limits: []int64{3}}
			banned := false
			for i := 0; i < 6; i++ {
				clock.Set(t0.Add(2*time.Second + time.Duration(i)*10*time.Millisecond))
				d, _ := canary.Decide(ctx, &k)
				if !d.Pass || d.DryRun != (i >= 3) {
					t.Fatalf("canary, K's request %d: pass %v, dry run %v (%v)", i+1, d.Pass, d.DryRun, d.Outcome)
				}
				banned = banned || d.Banned
			}
			if !banned {
				t.Errorf("the canary never reported K's would-be ban (2 would-be refusals ban it)")
			}
			clock.Set(t0.Add(3 * time.Second))
			d, _ := enforcing.Decide(ctx, &k)
			if d.Pass || d.Outcome != limiter.OutcomeLimited || d.Banned {
				t.Errorf("the enforcing node after the canary: pass %v, %v (banned %v); want limited (3 of 3 admitted), not banned",
					d.Pass, d.Outcome, d.Banned)
			}
			canary.Close()
			p.DryRun = false
			later, err := limiter.New(p, b) // a later config, enforcing
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(later.Close)
			if d, _ := later.Peek(ctx, &k); d.Banned {
				t.Errorf("a later enforcing config: K banned by the dry run's refusals")
			}
		})
	}
}
