package limiter_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// testLedger is a ledger on a redis-server of its own, and a grant call
// of identity "k" from data centre "a" under namespace ns wanting want
// units of a ceiling of 20 a minute.
func testLedger(t *testing.T, ns string) (*limiter.Ledger, func(want int64) *limiter.LedgerRequest) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return limiter.NewLedger(c), func(want int64) *limiter.LedgerRequest {
		return &limiter.LedgerRequest{Namespace: ns, Tag: "k", DC: "a", QWait: 62_000_000, Skew: 1_000_000, Beat: 2_000_000,
			WMax: 60_000_000, Tail: 3_000_000, Want: want, Length: 1_000_000, Rate: 1,
			Windows: []limiter.LedgerWindow{{Name: "1m", Len: 60_000_000, Limit: 20}}}
	}
}

// TestLedgerShowsWhatWasAdmitted: the ledger's show says what each data
// centre admitted of its grants as it last told the ledger: the use of a
// grant not ended, reported at a renewal (3 of 5), then at its return (4,
// the count shrunk to it), and nothing of a grant given back unused; the
// count it grants by is unchanged by the reports.
func TestLedgerShowsWhatWasAdmitted(t *testing.T) {
	t.Parallel()
	lg, req := testLedger(t, "lu:")
	ctx := context.Background()
	show := func(what string, admitted, counted int64) {
		t.Helper()
		shares, err := lg.Show(ctx, req(0))
		if err != nil {
			t.Fatal(err)
		}
		if len(shares) != 1 || shares[0].Datacenter != "a" || shares[0].Admitted != admitted || shares[0].Counted != counted {
			t.Fatalf("%s: shares %+v, want a's admitted %d of %d counted", what, shares, admitted, counted)
		}
	}
	g, err := lg.Do(ctx, "grant", req(5))
	if err != nil || g.Units != 5 {
		t.Fatalf("grant: %+v, %v", g, err)
	}
	show("granted", 0, 5)
	r := req(0)
	r.Used = []limiter.LedgerReturn{{ID: g.ID, Used: 3}}
	if _, err := lg.Do(ctx, "grant", r); err != nil {
		t.Fatal(err)
	}
	show("3 used, told at a renewal", 3, 5)
	r = req(2)
	r.Returns = []limiter.LedgerReturn{{ID: g.ID, Used: 4, Last: 1000}}
	g2, err := lg.Do(ctx, "grant", r)
	if err != nil || g2.Units != 2 || g2.Counts[0] != 6 {
		t.Fatalf("a return and a grant of 2: %+v, %v; want 2 granted, 6 counted", g2, err)
	}
	show("4 used, returned", 4, 6)
	r = req(0)
	r.Returns = []limiter.LedgerReturn{{ID: g2.ID, Used: 0}}
	if _, err := lg.Do(ctx, "grant", r); err != nil {
		t.Fatal(err)
	}
	show("a grant returned unused", 4, 4)
}

// TestLedgerIdsDoNotRepeatAfterAReset: after a reset forgets an identity's
// grants, the ledger's new grants have ids no earlier grant had, so a late
// return of an earlier one (a share that held it across the reset) leaves
// the new grants' count alone. Before, the ids started again at 1: the
// old grant's return shrank the new grant of the same id to the old one's
// use, and the units still held of it were counted nowhere.
func TestLedgerIdsDoNotRepeatAfterAReset(t *testing.T) {
	t.Parallel()
	lg, req := testLedger(t, "lr:")
	ctx := context.Background()
	old, err := lg.Do(ctx, "grant", req(5))
	if err != nil || old.Units != 5 {
		t.Fatalf("grant: %+v, %v", old, err)
	}
	if _, err := lg.Reset(ctx, req(0)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{old.ID: true}
	var last limiter.LedgerReply
	for range 3 {
		g, err := lg.Do(ctx, "grant", req(2))
		if err != nil || g.Units != 2 {
			t.Fatalf("grant after the reset: %+v, %v", g, err)
		}
		if seen[g.ID] {
			t.Fatalf("the ledger gave id %q again after the reset (ids %v)", g.ID, seen)
		}
		// The previous release writes an id's number with Lua's "%.14g"
		// (during an upgrade it grants from the same hash): exact below
		// 10^14 only, else ids a hundred grants apart print the same.
		if n, err := strconv.ParseInt(strings.TrimPrefix(g.ID, "a."), 10, 64); err != nil || n >= 1e14 {
			t.Fatalf("id %q: its number is not an integer below 10^14 (%v)", g.ID, err)
		}
		seen[g.ID], last = true, g
	}
	// The grant from before the reset comes back unused, late.
	r := req(0)
	r.Returns = []limiter.LedgerReturn{{ID: old.ID, Used: 0}}
	g, err := lg.Do(ctx, "grant", r)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Counts) != 1 || g.Counts[0] != 6 {
		t.Fatalf("after the late return of %s: counted %v, want the 6 units granted since the reset (last %s)", old.ID, g.Counts, last.ID)
	}
	// A grant and a reset, again and again, each a fraction of a ms: a
	// sequence that started again at the ledger's clock in ms gave a grant
	// of the same ms as the one before the reset its id (make test, once).
	for range 50 {
		if _, err := lg.Reset(ctx, req(0)); err != nil {
			t.Fatal(err)
		}
		g, err := lg.Do(ctx, "grant", req(1))
		if err != nil || g.Units != 1 {
			t.Fatalf("grant after a reset: %+v, %v", g, err)
		}
		if seen[g.ID] {
			t.Fatalf("the ledger gave id %q again after a reset (%d ids before)", g.ID, len(seen))
		}
		seen[g.ID] = true
	}
}
