package slidingratelimit

// global_redis: the numbers a client and an operator are shown say what
// was admitted and what is left of the ceiling, never a data centre's
// share presented as the ceiling.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestGlobalRedisHeadersSayTheCeiling: the first response of a key in a
// data centre says 19 of the ceiling's 20 are left (X-RateLimit-Remaining,
// RateLimit's global r), not the units of the share this data centre was
// granted (it said 3); each next one a unit fewer; the first in another
// data centre, once 4 were admitted, the ledger's room and its own share:
// at most 15, 19 less what the ledger counts of the first data centre's
// grants (their unspent units count as used: another data centre cannot
// rely on them).
func TestGlobalRedisHeadersSayTheCeiling(t *testing.T) {
	t.Parallel()
	ledger, eu, us := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	name := uniqueName()
	hs := map[string]*Handler{
		"eu-west": parseBlock(t, ledgerBlock(name, "eu-west", eu.Addr(), "global_redis redis://"+ledger.Addr())),
		"us-east": parseBlock(t, ledgerBlock(name, "us-east", us.Addr(), "global_redis redis://"+ledger.Addr())),
	}
	for _, h := range hs {
		provision(t, h, nil)
	}
	send := func(dc string) (int, int64, string) {
		t.Helper()
		o := mustServe(t, hs[dc], map[string]string{"X-API-Key": "k", "X-Region": dc})
		rem, err := strconv.ParseInt(o.header.Get("X-RateLimit-Remaining"), 10, 64)
		if err != nil {
			t.Fatalf("%s: X-RateLimit-Remaining %q", dc, o.header.Get("X-RateLimit-Remaining"))
		}
		return o.code, rem, o.header.Get("RateLimit")
	}
	for i := range int64(4) {
		code, rem, rl := send("eu-west")
		want := 19 - i
		if code != http.StatusOK || rem != want || !hasItem(rl, name+"-global", want) {
			t.Fatalf("eu-west request %d: %d, X-RateLimit-Remaining %d, RateLimit %q; want 200, %d left of the ceiling in both", i+1, code, rem, rl, want)
		}
	}
	// What the ledger counts of eu-west's grants, once its renewals ahead
	// of need are done (two reads alike, 100 ms apart).
	counted := int64(-1)
	for range 50 {
		c := countedOf(t, hs["eu-west"], "k", "eu-west")
		if c == counted {
			break
		}
		counted = c
		time.Sleep(100 * time.Millisecond) // for a renewal in flight to deposit, not to cross a window
	}
	code, rem, rl := send("us-east")
	switch {
	case code == http.StatusOK && rem == 19-counted && rem <= 15 && hasItem(rl, name+"-global", rem):
	case code == http.StatusTooManyRequests && counted == 20 && rem == 0 && hasItem(rl, name+"-global", 0):
		// eu-west was granted the whole ceiling: none of it is left to
		// rely on here.
	default:
		t.Fatalf("us-east's first request: %d, X-RateLimit-Remaining %d, RateLimit %q; want 200 and %d left (at most 15: 5 admitted; eu-west's %d counted by the ledger count as used), or 429 and 0 when eu-west holds the whole ceiling",
			code, rem, rl, 19-counted, counted)
	}
}

// countedOf is what the ledger counts of dc's grants of key.
func countedOf(t *testing.T, h *Handler, key, dc string) int64 {
	t.Helper()
	shares, err := h.rt.lim.Shares(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shares {
		if s.Datacenter == dc {
			return s.Counted
		}
	}
	return 0
}

// hasItem reports whether a RateLimit header has policy's item with r.
func hasItem(rl, policy string, r int64) bool {
	for _, it := range splitItems(rl) {
		if it == `"`+policy+`";r=`+strconv.FormatInt(r, 10) {
			return true
		}
	}
	return false
}

// splitItems is a RateLimit header's items, each without its t.
func splitItems(rl string) []string {
	var out []string
	for _, it := range strings.Split(rl, ", ") {
		it, _, _ = strings.Cut(it, ";t=")
		out = append(out, it)
	}
	return out
}

// TestGlobalRedisAdminCountsWhatWasAdmitted: the admin GET and `caddy
// ratelimit show` count the global window as what was admitted, per data
// centre and in all (they said the limit less what this data centre's
// share held: 20 used when 5 were admitted), each data centre's admitted
// exact where it is asked and, for another, as it last told the ledger;
// and `datacenters` is the data centres listed (it said 1 while listing
// 2: this node's count from its last ledger call). The metrics count the
// units each data centre admitted under the ceiling.
func TestGlobalRedisAdminCountsWhatWasAdmitted(t *testing.T) {
	t.Parallel()
	ledger, eu, us := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	name := uniqueName()
	hs := map[string]*Handler{
		"eu-west": parseBlock(t, ledgerBlock(name, "eu-west", eu.Addr(), "global_redis redis://"+ledger.Addr())),
		"us-east": parseBlock(t, ledgerBlock(name, "us-east", us.Addr(), "global_redis redis://"+ledger.Addr())),
	}
	for _, h := range hs {
		provision(t, h, nil)
	}
	admitted := map[string]int64{}
	for dc, n := range map[string]int{"eu-west": 3, "us-east": 2} {
		for range n {
			if o := mustServe(t, hs[dc], map[string]string{"X-API-Key": "k", "X-Region": dc}); o.code == http.StatusOK {
				admitted[dc]++
			}
		}
	}
	total := admitted["eu-west"] + admitted["us-east"]
	for dc, n := range admitted {
		if got := gatherLabel(t, "caddy_sliding_ratelimit_global_admitted_units_total", name, "datacenter", dc); got != float64(n) {
			t.Errorf("global_admitted_units_total{datacenter=%q} = %v, want the %d it admitted", dc, got, n)
		}
	}
	for dc, h := range hs {
		u := usageOf(t, h, name, "k")
		g := u.Global
		if g == nil || g.SharesError != "" || g.Datacenters != 2 || len(g.Shares) != 2 {
			t.Fatalf("%s: admin GET global %+v: want the ledger's 2 shares and datacenters 2", dc, g)
		}
		var sum int64
		for _, s := range g.Shares {
			sum += s.Admitted
			if s.Datacenter == dc && s.Admitted != admitted[dc] {
				t.Errorf("%s: its share says %d admitted, want the %d it admitted", dc, s.Admitted, admitted[dc])
			}
			if s.Admitted > s.Counted {
				t.Errorf("%s: share %+v admitted more than the ledger counts", dc, s)
			}
		}
		if g.Admitted != sum || g.Admitted < admitted[dc] || g.Admitted > total {
			t.Errorf("%s: admitted %d in all (shares' sum %d), want %d to %d (this data centre's exact, the other's as it last told the ledger)", dc, g.Admitted, sum, admitted[dc], total)
		}
		var global *windowUsage
		for i := range u.Windows {
			if u.Windows[i].Global {
				global = &u.Windows[i]
			}
		}
		if global == nil || global.Count != g.Admitted || global.Limit != 20 || global.Remaining > 20-total {
			t.Errorf("%s: the global window %+v: want count %d (admitted in all), limit 20, at most %d remaining", dc, global, g.Admitted, 20-total)
		}
		var out strings.Builder
		if err := writeUsage(&out, &u); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"2 data centres known", "DATACENTER", "ADMITTED", dc + " (this node)  " + strconv.FormatInt(admitted[dc], 10) + " ", "in all", name + "-global  " + strconv.FormatInt(g.Admitted, 10) + " "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: caddy ratelimit show:\n%s\nwant %q", dc, out.String(), want)
			}
		}
	}
}

// usageOf is the admin GET of key.
func usageOf(t *testing.T, h *Handler, name, key string) usageInfo {
	t.Helper()
	code, body := adminGetHandler(t, h, name, "key="+key+"&region="+h.Datacenter)
	if code != http.StatusOK {
		t.Fatalf("admin GET: %d %s", code, body)
	}
	var u usageInfo
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatal(err)
	}
	return u
}

// adminGetHandler is the admin GET as h's node answers it (two data
// centres' handlers of one name live in this one process; the admin API
// would answer from the newest).
func adminGetHandler(t *testing.T, h *Handler, name, query string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/sliding_ratelimit/"+name+"?"+query, nil)
	if err := serveKey(w, r, name, []*Handler{h}); err != nil {
		return http.StatusInternalServerError, err.Error()
	}
	return w.Code, w.Body.String()
}
