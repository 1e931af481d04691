package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/netproxy"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestStaleRenewalDoesNotReturnALiveGrant: a renewal under limits of
// another signature (a node not yet reloaded, or a renewal queued before a
// reload) must not give the ledger back the grants of the share's own
// limits: they are still usable under those limits, so units spent after
// the return would be counted nowhere. Here node X holds a grant under the
// limit in force (10 per minute); node Y of the same data centre asks
// under its stale limit (1), and is held between the ledger's answer and
// its deposit while X spends the grant; then X renews. X must admit at
// most 10 in the minute: with the stale renewal's return of X's grant,
// the ledger counted one unit of it and granted X the limit again.
func TestStaleRenewalDoesNotReturnALiveGrant(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	w := minuteWorld(t, 1, 2)
	staleRenewal(t, w.dcs[0].nodes[0], w.dcs[0].nodes[1])
}

// staleRenewal runs the scenario on x and y, two nodes of one data centre.
func staleRenewal(t *testing.T, x, y *limiter.Limiter) {
	const limit, stale = 10, 1
	ctx := context.Background()
	in := func(l int64) *limiter.Input {
		return &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{l}}
	}
	admitted := 0
	decide := func() limiter.Decision {
		d, err := x.Decide(ctx, in(limit))
		if err != nil {
			t.Fatal(err)
		}
		if d.Pass {
			admitted++
		}
		return d
	}
	if d := decide(); !d.Pass {
		t.Fatalf("X's first request: %+v", d)
	}
	// Y, under the stale limit, is held once the ledger answered it.
	ydone, release := heldAtGrant(t, y, in(stale), "Y's request")
	// X spends what its share holds while Y's renewal is between the
	// ledger and the share.
	for range 2 * limit {
		if d := decide(); !d.Pass {
			break
		}
	}
	release()
	if d := <-ydone; d.Pass {
		t.Errorf("Y admitted under a limit of %d after X's admissions: %+v", stale, d)
	}
	// X renews until the ledger says it is full (its retry is the window's
	// tail, far more than a renewal's lead).
	deadline := time.Now().Add(10 * time.Second)
	during := admitted
	for admitted <= 3*limit {
		if d := decide(); !d.Pass && d.RetryAfter > 10*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("X admitted %d and the ledger never said it was full", admitted)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if admitted > limit {
		t.Fatalf("X admitted %d in the minute under a limit of %d (%d before Y's deposit): %d over the ceiling", admitted, limit, during, admitted-limit)
	}
}

// shareStore is a store that keeps shares, and resets keys.
type shareStore interface {
	limiter.ShareStore
	Reset(ctx context.Context, keys ...string) error
}

// shareStores is each store that keeps shares, by name: the Redis store
// on a redis-server of its own, and the in-process store.
func shareStores(t *testing.T) map[string]shareStore {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	rs := limiter.NewRedisStore(c)
	t.Cleanup(func() { rs.Close() })
	ms := limiter.NewMemoryStore()
	t.Cleanup(func() { ms.Close() })
	return map[string]shareStore{"redis": rs, "in-process": ms}
}

// TestShareBeginUnderOtherLimits: a renewal's read of a share under other
// limits than the share's (each store) gives it none of the share's grants
// to return: they are still usable under their own limits.
func TestShareBeginUnderOtherLimits(t *testing.T) {
	ctx := context.Background()
	for name, s := range shareStores(t) {
		view, err := s.ShareBegin(ctx, "share", "10", false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: view.Now, Units: 8, Length: time.Minute.Microseconds(), ID: "g1", Sig: "10", Inc: view.Inc}); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.ShareBegin(ctx, "share", "10", false); len(v.Grants) != 1 || v.Grants[0].Units != 8 {
			t.Fatalf("%s: the share under its own limits: %+v, want the grant of 8", name, v.Grants)
		}
		if v, _ := s.ShareBegin(ctx, "share", "1", false); len(v.Grants) != 0 {
			t.Errorf("%s: the share read under other limits holds %+v: a renewal would give back a grant still in use", name, v.Grants)
		}
		// A deposit Only under other limits (a closed limiter's renewal)
		// changes nothing; one of the share's own limits lands.
		if _, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: view.Now, Units: 3, Length: time.Minute.Microseconds(), ID: "g2", Sig: "1", Only: true, Inc: view.Inc}); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.ShareBegin(ctx, "share", "10", false); len(v.Grants) != 1 || v.Grants[0].ID != "g1" {
			t.Errorf("%s: after a closed limiter's deposit under other limits: %+v, want the grant g1 of 8 still", name, v.Grants)
		}
		if _, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: view.Now, Units: 3, Length: time.Minute.Microseconds(), ID: "g3", Sig: "10", Only: true, Inc: view.Inc}); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.ShareBegin(ctx, "share", "10", false); len(v.Grants) != 2 {
			t.Errorf("%s: after a closed limiter's deposit under the share's limits: %+v, want g1 and g3", name, v.Grants)
		}
	}
}

// TestDepositIntoAResetShareChangesNothing: a renewal that read a share
// before a reset (each store deletes it) deposits into none after it: not
// its grant (of a ledger the reset forgot, or counted by one that will
// not know it is in use), not "the ledger is full", not the counts. A
// renewal that reads the share after the reset lands.
func TestDepositIntoAResetShareChangesNothing(t *testing.T) {
	ctx := context.Background()
	minute := time.Minute.Microseconds()
	for name, s := range shareStores(t) {
		first, err := s.ShareBegin(ctx, "share", "10", false)
		if err != nil {
			t.Fatal(err)
		}
		if first.Inc == "" {
			t.Fatalf("%s: a share's first read gives no incarnation", name)
		}
		if again, _ := s.ShareBegin(ctx, "share", "10", false); again.Inc != first.Inc {
			t.Fatalf("%s: two reads of one share give incarnations %q and %q", name, first.Inc, again.Inc)
		}
		if slot, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: first.Now, Units: 8, Length: minute, ID: "g1", Sig: "10", Inc: first.Inc}); err != nil || slot != 1 {
			t.Fatalf("%s: deposit into the share read: slot %d, %v; want slot 1", name, slot, err)
		}
		// A renewal reads the share; a reset deletes it; the renewal lands.
		before, _ := s.ShareBegin(ctx, "share", "10", false)
		if err := s.Reset(ctx, "share"); err != nil {
			t.Fatal(err)
		}
		slot, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: before.Now, Units: 5, Length: minute, ID: "g2", Sig: "10",
			Retry: minute, Recheck: time.Second.Microseconds(), Counts: []int64{20}, Returned: []string{"g1"}, Inc: before.Inc})
		if err != nil || slot != -1 {
			t.Fatalf("%s: a deposit read before a reset, after it: slot %d, %v; want -1 (nothing changed)", name, slot, err)
		}
		after, _ := s.ShareBegin(ctx, "share", "10", false)
		if len(after.Grants) != 0 || after.Inc == before.Inc {
			t.Fatalf("%s: after the reset and the old renewal's deposit: grants %+v, incarnation %q (was %q); want none, a new one",
				name, after.Grants, after.Inc, before.Inc)
		}
		// The renewal that read the reset share lands.
		if slot, err := s.ShareDeposit(ctx, "share", limiter.Deposit{T0: after.Now, Units: 3, Length: minute, ID: "g3", Sig: "10", Inc: after.Inc}); err != nil || slot != 1 {
			t.Fatalf("%s: deposit of a renewal that read the reset share: slot %d, %v; want slot 1", name, slot, err)
		}
		if v, _ := s.ShareBegin(ctx, "share", "10", false); len(v.Grants) != 1 || v.Grants[0].ID != "g3" {
			t.Errorf("%s: the share after the new renewal: %+v, want g3 alone", name, v.Grants)
		}
		if err := s.Reset(ctx, "share"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRenewalAcrossAReloadKeepsTheNewGrants: a node's renewal under the
// limits of its config is held between the ledger's grant and its deposit
// (a slow renewal) while a reload puts new limits in force (node Y, the
// new config, builds a share under them) and the old config closes. The
// old renewal must not drop the new limits' grants when it lands: with the
// ledger then cut off, Y's requests are admitted from the share it holds.
// Before the fix, a request's own renewal was not waited for by Close,
// and every renewal deposited under its old limits after it: Y's grants
// went, and Y's requests got 503 (fail closed, the ledger cut off).
func TestRenewalAcrossAReloadKeepsTheNewGrants(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	const old, now = 100, 50
	w := minuteWorld(t, 1, 2)
	x, y := w.dcs[0].nodes[0], w.dcs[0].nodes[1]
	ctx := context.Background()
	in := func(l int64) *limiter.Input {
		return &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{l}}
	}
	if d, err := x.Decide(ctx, in(old)); err != nil || !d.Pass {
		t.Fatalf("X's first request: %+v, %v", d, err)
	}
	// X's next renewal is held once the ledger answered it.
	reached, release, deposited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var held, holding atomic.Bool
	limiter.SetGlobalHook(x, func(stage string) {
		switch {
		case stage == "granted" && held.CompareAndSwap(false, true):
			close(reached)
			<-release
			holding.Store(true)
		case stage == "deposited" && holding.CompareAndSwap(true, false):
			close(deposited)
		}
	})
	for i := 0; ; i++ {
		if _, err := x.Decide(ctx, in(old)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-reached:
		case <-time.After(5 * time.Millisecond): // pacing X's requests until one renews
			if i == 1000 {
				t.Fatal("no renewal of X reached the ledger")
			}
			continue
		}
		break
	}
	// The reload: Y, under the new limit, holds a share of it.
	c := redis.NewClient(&redis.Options{Addr: w.dcs[0].srv.Addr()})
	t.Cleanup(func() { c.Close() })
	skey := y.Keys().Global("share", "k")
	for deadline := time.Now().Add(10 * time.Second); unspent(t, c, skey) < 3; {
		if d, err := y.Decide(ctx, in(now)); err != nil || !d.Pass {
			t.Fatalf("building Y's share: %+v, %v", d, err)
		}
		if time.Now().After(deadline) {
			t.Fatal("Y holds no share of 3 units after 10 s")
		}
		time.Sleep(10 * time.Millisecond) // for Y's renewals to land, not crossing a window
	}
	// The ledger cut off; the old config closes, and its renewal lands.
	w.dcs[0].proxy.Cut()
	closed := make(chan struct{}, 1)
	go func() {
		x.Close()
		closed <- struct{}{}
	}()
	for deadline := time.Now().Add(10 * time.Second); !limiter.GlobalClosing(x); {
		if time.Now().After(deadline) {
			t.Fatal("X's Close did not begin within 10 s")
		}
		time.Sleep(time.Millisecond) // polling for Close to begin
	}
	close(release)
	for _, ch := range []chan struct{}{deposited, closed} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("X's renewal or Close did not end within 10 s")
		}
	}
	for i := range 3 {
		d, err := y.Decide(ctx, in(now))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Pass || d.Source != limiter.SourceRedis {
			t.Errorf("Y's request %d after the old config's renewal landed (the ledger cut off, Y's share held %d units before): %v from %s (Retry-After %v); want admitted from the share",
				i+1, 3, d.Outcome, d.Source, d.RetryAfter)
		}
	}
}

// unspent is the units the share at key holds unspent (its slots' n - u).
func unspent(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	v, err := c.HMGet(context.Background(), key, "1n", "1u", "2n", "2u", "3n", "3u", "4n", "4u").Result()
	if err != nil {
		t.Fatal(err)
	}
	var rem int64
	for i := 0; i < len(v); i += 2 {
		var units, used int64
		fmt.Sscan(fmt.Sprint(v[i]), &units)
		fmt.Sscan(fmt.Sprint(v[i+1]), &used)
		rem += max(units-used, 0)
	}
	return rem
}

// TestResetDuringARenewal: an operator's reset (the ledger, then the data
// centre's share, as the admin API does) while a renewal is between the
// ledger's grant and its deposit. The renewal asked the ledger the reset
// forgot: its grant is counted nowhere now, so it must not land in the
// reset share. After the reset the identity is admitted the ceiling's
// limit in the window, not the limit and the old grant's units (before the
// fix the deposit landed, and the request the renewal was for was admitted
// from it, uncounted). That request is admitted from what the renewal
// asks again, on the reset share (not refused by a share left empty).
func TestResetDuringARenewal(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	// 10 a minute: the ledger grants one data centre a burst of 10 at once
	// (then its fair rate, one every 6 s).
	const limit = 10
	w := minuteWorld(t, 1, 1)
	x := w.dcs[0].nodes[0]
	ctx := context.Background()
	in := &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}}
	// The identity's first request asks the ledger; its renewal is held
	// once the ledger granted.
	first, release := heldAtGrant(t, x, in, "the first request")
	if _, _, err := x.ResetGlobal(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Reset(ctx, "k", "dc0"); err != nil {
		t.Fatal(err)
	}
	release()
	admitted := 0
	if d := <-first; d.Pass {
		admitted++
	} else {
		// Its renewal's deposit changed nothing, and it asked the ledger
		// again on the reset share, which has room.
		t.Errorf("the request whose renewal straddled the reset: %v from %s (Retry-After %v), want admitted", d.Outcome, d.Source, d.RetryAfter)
	}
	// Round after round until the ceiling's limit is admitted (a share
	// held unused comes back within a second), or long after it should
	// have been; then no more.
	for deadline := time.Now().Add(20 * time.Second); admitted < limit && time.Now().Before(deadline); {
		for range 10 {
			d, err := x.Decide(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Pass {
				admitted++
			}
		}
		time.Sleep(50 * time.Millisecond) // let a grant end, not to cross a window
	}
	for range 2 * limit {
		d, err := x.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if d.Pass {
			admitted++
		}
	}
	if admitted != limit {
		t.Fatalf("admitted %d in the minute after the reset, want the ceiling's %d (over it: a grant of the ledger the reset forgot was used)", admitted, limit)
	}
}

// heldAtGrant starts a request of l (in) whose renewal is held once the
// ledger granted, until release; it waits for the hold. The request's
// decision comes on the channel.
func heldAtGrant(t *testing.T, l *limiter.Limiter, in *limiter.Input, who string) (<-chan limiter.Decision, func()) {
	t.Helper()
	reached, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	limiter.SetGlobalHook(l, func(stage string) {
		if stage == "granted" && held.CompareAndSwap(false, true) {
			close(reached)
			<-release
		}
	})
	decided := make(chan limiter.Decision, 1)
	go func() {
		d, err := l.Decide(context.Background(), in)
		if err != nil {
			t.Error(err)
		}
		decided <- d
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: its renewal did not reach the ledger within 10 s", who)
	}
	return decided, func() { close(release) }
}

// TestResetReachesEveryDatacentre: an operator's reset through data centre
// A while B holds unspent units of the identity's grants. The ledger forgets
// those grants, so B must not spend them after: the ledger tells B (a
// recall marked reset) and B drops its share within a recall's round. From
// then on the two admit the ceiling's limit in the window, not the limit
// and what B held (before, B kept spending it, uncounted, until its grants
// ended).
func TestResetReachesEveryDatacentre(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	const limit = 10 // one data centre is granted 10 at once (the ledger's burst)
	w := minuteWorld(t, 2, 1)
	a, b := w.dcs[0].nodes[0], w.dcs[1].nodes[0]
	ctx := context.Background()
	in := func(dc string) *limiter.Input {
		return &limiter.Input{Identity: "k", Region: dc, Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}}
	}
	c, skey := holdShare(t, w, b, in("dc1"))
	held := unspent(t, c, skey)
	told, ok, err := a.ResetGlobal(ctx, "k")
	if err != nil || !ok || told != 1 {
		t.Fatalf("the reset through A: %d data centres told (%v, %v), want B", told, ok, err)
	}
	if _, err := a.Reset(ctx, "k", "dc0"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); unspent(t, c, skey) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("B still holds %d units of the grants the reset forgot (%d before it) 5 s after it", unspent(t, c, skey), held)
		}
		time.Sleep(10 * time.Millisecond) // polling for B's drop
	}
	admitted := 0
	decide := func(l *limiter.Limiter, dc string) {
		d, err := l.Decide(ctx, in(dc))
		if err != nil {
			t.Fatal(err)
		}
		if d.Pass {
			admitted++
		}
	}
	for deadline := time.Now().Add(20 * time.Second); admitted < limit && time.Now().Before(deadline); {
		for range 10 {
			decide(a, "dc0")
			decide(b, "dc1")
		}
		time.Sleep(50 * time.Millisecond) // let a grant end, not to cross a window
	}
	for range 2 * limit {
		decide(a, "dc0")
		decide(b, "dc1")
	}
	if admitted != limit {
		t.Fatalf("A and B admitted %d in the minute after the reset, want the ceiling's %d (B held %d of the forgotten grants)", admitted, limit, held)
	}
}

// holdShare sends node b of dc1 requests in until its data centre's share
// of in's identity holds 3 units or more unspent; it returns a client of
// dc1's Redis and the share's key.
func holdShare(t *testing.T, w *mdcWorld, b *limiter.Limiter, in *limiter.Input) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: w.dcs[1].srv.Addr()})
	t.Cleanup(func() { c.Close() })
	skey := b.Keys().Global("share", in.Identity)
	for deadline := time.Now().Add(10 * time.Second); unspent(t, c, skey) < 3; {
		if _, err := b.Decide(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("B holds no share of 3 units after 10 s")
		}
		time.Sleep(10 * time.Millisecond) // for B's renewals to land, not crossing a window
	}
	return c, skey
}

// TestResetDropRetried: a reset's recall reaches a data centre whose node
// is cut off from its Redis (longer than the drop's two tries take); the
// ledger does not tell it again, so the node keeps the failed drop and
// tries it every recall poll: once the Redis answers, the share the
// reset forgot is dropped (before, it was left, and spent until its
// grants ended).
func TestResetDropRetried(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	w := cutWorld(t, 2*time.Second, time.Minute)
	c, skey := holdShare(t, w, w.dcs[1].nodes[0], &limiter.Input{Identity: "k", Region: "dc1", Limits: []int64{1 << 40}, GlobalLimits: []int64{10}})
	held := unspent(t, c, skey)
	px := cutAndReset(t, w)
	// B reads the recall within a poll (250 ms) and its drop's two tries
	// take a timeout (1 s) each: the cut healed once the first drop failed
	// and was kept (nothing sent during the cut reaches Redis after it).
	b := w.dcs[1].nodes[0]
	for deadline := time.Now().Add(10 * time.Second); limiter.PendingDrops(b) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("B kept no failed drop 10 s after the reset")
		}
		time.Sleep(20 * time.Millisecond) // polling for B's first drop to fail
	}
	px.Heal()
	for deadline := time.Now().Add(5 * time.Second); unspent(t, c, skey) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("B still holds %d units of the grants the reset forgot (%d before it) 5 s after its Redis answers again", unspent(t, c, skey), held)
		}
		time.Sleep(10 * time.Millisecond) // polling for B's drop
	}
	// The drop is told after it lands, and nothing is kept after it.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		n, failed := w.events[limiter.EventDropped], w.dropsFailed
		w.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			if n != 1 || failed != 0 {
				t.Fatalf("%d drops told (%d failed), want the one that succeeded: a try that fails and is kept is not a failed drop", n, failed)
			}
			break
		}
	}
	if n := limiter.PendingDrops(b); n != 0 {
		t.Fatalf("B still keeps %d drops after the share was dropped", n)
	}
}

// TestResetDropGivenUp: a node cut off from its data centre's Redis for
// good tries a reset's drop until every grant the share may hold has ended
// (the longest grant, 3.2 s here: 16 grants of 200 ms, and the skew), then
// gives it up, told as a failed drop (global_reset_drops_total{result=
// "failed"}) once: not sooner (the first try's two calls fail 2 s after the
// recall), and not again.
func TestResetDropGivenUp(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	w := cutWorld(t, 200*time.Millisecond, time.Minute)
	in := &limiter.Input{Identity: "k", Region: "dc1", Limits: []int64{1 << 40}, GlobalLimits: []int64{10}}
	if d, err := w.dcs[1].nodes[0].Decide(context.Background(), in); err != nil || !d.Pass {
		t.Fatalf("B's first request: %+v, %v", d, err)
	}
	reset := time.Now()
	cutAndReset(t, w)
	for deadline := time.Now().Add(15 * time.Second); ; {
		w.mu.Lock()
		n, failed := w.events[limiter.EventDropped], w.dropsFailed
		w.mu.Unlock()
		if failed > 0 {
			if n != 1 || failed != 1 {
				t.Fatalf("%d drops told, %d failed: want one, failed", n, failed)
			}
			if took := time.Since(reset); took < 3200*time.Millisecond {
				t.Fatalf("the drop given up %v after the reset, before the share's grants could all have ended (3.2 s)", took)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed drop told 15 s after the reset (%d drops told)", n)
		}
		time.Sleep(20 * time.Millisecond) // polling for B's give-up
	}
	time.Sleep(500 * time.Millisecond) // two recall polls: not told again
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.events[limiter.EventDropped]; n != 1 {
		t.Fatalf("%d drops told after the give-up, want 1", n)
	}
}

// cutWorld is two data centres of a node each, fail closed, no delay to
// the ledger, grants of length, one global window of win, each node's
// Redis behind a proxy (mdcOpts.storeProxy).
func cutWorld(t *testing.T, length, win time.Duration) *mdcWorld {
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes, o.storeProxy = 2, 1, true
	o.delay = func(int) time.Duration { return 0 }
	o.length = length
	o.policy.GlobalWindows = []limiter.Window{{Duration: win}}
	return newMDCWorld(t, o)
}

// cutAndReset cuts B (dc1's node) off from its Redis (healed at the
// test's end, or by the caller) and resets identity k through A, which
// must tell B's data centre.
func cutAndReset(t *testing.T, w *mdcWorld) *netproxy.Proxy {
	t.Helper()
	px := w.dcs[1].store
	px.Cut()
	t.Cleanup(px.Heal)
	told, ok, err := w.dcs[0].nodes[0].ResetGlobal(context.Background(), "k")
	if err != nil || !ok || told != 1 {
		t.Fatalf("the reset through A: %d data centres told (%v, %v), want B", told, ok, err)
	}
	return px
}

// minuteWorld is dcs data centres of nodes nodes each, fail closed, no
// delay to the ledger, one global window of a minute, and grants that
// outlive the test (2 s long): no clock matters.
func minuteWorld(t *testing.T, dcs, nodes int) *mdcWorld {
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes = dcs, nodes
	o.delay = func(int) time.Duration { return 0 }
	o.length = 2 * time.Second
	o.policy.GlobalWindows = []limiter.Window{{Duration: time.Minute}}
	return newMDCWorld(t, o)
}

// TestResetNotDurableIsSaid: with the ledger's replica cut off from it, an
// operator's reset is carried out on the primary (B told to drop its share)
// and said not acknowledged by the replicas (ErrResetNotDurable: a failover
// now may lose it); with the replica back, a reset is acknowledged.
func TestResetNotDurableIsSaid(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes, o.replica = 2, 1, true
	o.delay = func(int) time.Duration { return 0 }
	o.length = 2 * time.Second
	o.policy.GlobalWindows = []limiter.Window{{Duration: time.Minute}}
	w := newMDCWorld(t, o)
	a, b := w.dcs[0].nodes[0], w.dcs[1].nodes[0]
	ctx := context.Background()
	in := func(dc string) *limiter.Input {
		return &limiter.Input{Identity: "k", Region: dc, Limits: []int64{1 << 40}, GlobalLimits: []int64{1000}}
	}
	// A grant on both sides: each node's ledger learns the replica from its
	// first reply (that first grant, not waited for, is not used).
	for _, x := range []struct {
		l  *limiter.Limiter
		dc string
	}{{a, "dc0"}, {b, "dc1"}} {
		for i := 0; ; i++ {
			d, err := x.l.Decide(ctx, in(x.dc))
			if err != nil {
				t.Fatal(err)
			}
			if d.Pass {
				break
			}
			if i == 20 {
				t.Fatalf("%s: no grant in 20 tries: %+v", x.dc, d)
			}
			time.Sleep(min(d.RetryAfter, 200*time.Millisecond) + time.Millisecond) // the ledger's pace
		}
	}
	w.replProxy.Cut()
	told, ok, err := a.ResetGlobal(ctx, "k")
	if !errors.Is(err, limiter.ErrResetNotDurable) || !ok || told != 1 {
		t.Fatalf("the reset with the replica cut off: %d data centres told, %v; want B told and ErrResetNotDurable", told, err)
	}
	// Healed, and the replica's link reset (the cut dropped part of its
	// stream): it connects again and resyncs.
	w.replProxy.Heal()
	w.replProxy.Reset()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, _, err = a.ResetGlobal(ctx, "k"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a reset 10 s after the replica's link healed: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling for the replica's resync
	}
}
