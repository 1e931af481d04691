package slidingratelimit

// global_redis: what a client sees under each fault of docs/multidc.md's
// table (Faults), under each fail mode, through handlers built from
// Caddyfiles, with real redis-servers: the data centre's own, and the
// ledger behind a proxy that can cut it off.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/netproxy"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// faultDC is one data centre's node: its own redis-server, and the ledger
// reached through a proxy.
type faultDC struct {
	h     *Handler
	dc    *redistest.Server
	proxy *netproxy.Proxy
	name  string
}

// newFaultDC builds a node with fail mode fail, a global ceiling of 20 a
// minute kept in ledger (reached through a proxy), each ledger call within
// 300 ms.
func newFaultDC(t *testing.T, ledger *redistest.Server, fail string) *faultDC {
	t.Helper()
	p, err := netproxy.New(ledger.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	dc := redistest.Start(t)
	name := uniqueName()
	src := strings.Replace(ledgerBlock(name, "eu-west", dc.Addr(), "global_redis {\n\t\taddress "+p.Addr()+"\n\t\ttimeout 300ms\n\t}"),
		"datacenter eu-west", "datacenter eu-west\n\tfail "+fail, 1)
	h := parseBlock(t, src)
	provision(t, h, nil)
	return &faultDC{h: h, dc: dc, proxy: p, name: name}
}

// faultOutcome is a response: status, body, the rate limit headers, the
// source placeholder.
type faultOutcome struct {
	code                 int
	body, source         string
	retry, rl, remaining string
	policy               string
}

func (o faultOutcome) String() string {
	return fmt.Sprintf("%d %q source %s Retry-After %q RateLimit %q X-RateLimit-Remaining %q", o.code, strings.TrimSpace(o.body), o.source, o.retry, o.rl, o.remaining)
}

func (f *faultDC) send(t *testing.T, key string) faultOutcome {
	t.Helper()
	w, r, repl := newRequest(map[string]string{"X-API-Key": key, "X-Region": "eu"})
	if err := f.h.ServeHTTP(w, r, nextOK); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	o := faultOutcome{code: w.Code, body: w.Body.String(), retry: w.Header().Get("Retry-After"),
		rl: w.Header().Get("RateLimit"), remaining: w.Header().Get("X-RateLimit-Remaining"), policy: w.Header().Get("RateLimit-Policy")}
	o.source, _ = repl.GetString(phSource)
	return o
}

// unavailable checks a 503 of the fail mode: its body, Retry-After 1, and
// no header that claims a count.
func unavailable(t *testing.T, what string, o faultOutcome) {
	t.Helper()
	if o.code != http.StatusServiceUnavailable || strings.TrimSpace(o.body) != `{"error":"rate_limiter_unavailable"}` ||
		o.retry != "1" || o.rl != "" || o.remaining != "" || o.source != "fail_closed" {
		t.Errorf("%s: %s; want 503 rate_limiter_unavailable, Retry-After 1, no RateLimit nor X-RateLimit-Remaining, source fail_closed", what, o)
	}
}

// passed checks a request admitted from source: from the share, with the
// ceiling's RateLimit item and X-RateLimit-Remaining; passed by fail open,
// with neither (nothing was counted).
func passed(t *testing.T, what string, o faultOutcome, source string) {
	t.Helper()
	counted := source != "fail_open"
	if o.code != http.StatusOK || o.source != source || strings.Contains(o.rl, `-global";r=`) != counted || (o.remaining != "") != counted {
		t.Errorf("%s: %s; want 200 from %s, a RateLimit item of the ceiling and X-RateLimit-Remaining: %v", what, o, source, counted)
	}
}

// holdShare sends key's requests until the data centre holds a share of
// at least n units unspent (the ledger has room: 20), and returns it.
func (f *faultDC) holdShare(t *testing.T, key string, n int64) int64 {
	t.Helper()
	c := f.dc.Client(t)
	skey := f.h.rt.lim.Keys().Global("share", key)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var rem int64
		v, err := c.HMGet(context.Background(), skey, "1n", "1u", "2n", "2u", "3n", "3u", "4n", "4u").Result()
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(v); i += 2 {
			var units, used int64
			fmt.Sscan(fmt.Sprint(v[i]), &units)
			fmt.Sscan(fmt.Sprint(v[i+1]), &used)
			rem += max(units-used, 0)
		}
		if rem >= n {
			return rem
		}
		if o := f.send(t, key); o.code != http.StatusOK {
			t.Fatalf("building a share: %s", o)
		}
		time.Sleep(20 * time.Millisecond) // for the renewal ahead of need to deposit, not to cross a window
	}
	t.Fatalf("the data centre holds no share of %d units of %s after 10 s", n, key)
	return 0
}

// TestGlobalRedisFaultTable: each row of docs/multidc.md's Faults table
// under each fail mode, as a client sees it.
func TestGlobalRedisFaultTable(t *testing.T) {
	t.Parallel()
	ledger := redistest.Start(t)
	for _, fail := range []string{"closed", "local", "open"} {
		t.Run(fail, func(t *testing.T) {
			t.Parallel()
			f := newFaultDC(t, ledger, fail)
			// The ledger is cut off, the share still holds: admitted from
			// the share, locally.
			held := f.holdShare(t, "held", 3)
			f.proxy.Cut()
			for i := range held {
				passed(t, fmt.Sprintf("cut off, %d of the %d units the share held", i+1, held), f.send(t, "held"), "redis")
			}
			// Cut off, the share spent (a new identity has none): the
			// fail mode. Fail local waits for its static share (81 s with
			// these limits; limiter's TestGlobalCeilingFaults covers it):
			// until then, 503.
			for i := range 3 {
				what := fmt.Sprintf("cut off, a share to ask for (request %d)", i+1)
				o := f.send(t, "new")
				if fail == "open" {
					passed(t, what, o, "fail_open")
				} else {
					unavailable(t, what, o)
				}
			}
			// The ledger answers again: renewals resume; fail open's
			// counted passes stop.
			f.proxy.Heal()
			f.recovers(t, "new")
			before := gather(t, "caddy_sliding_ratelimit_global_fail_open_total", f.name)
			passed(t, "the ledger back", f.send(t, "new"), "redis")
			if after := gather(t, "caddy_sliding_ratelimit_global_fail_open_total", f.name); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("global_fail_open_total %v after the ledger answered again, was %v", after, before)
			}
		})
	}
}

// recovers sends key's requests until one is admitted from the share, at
// most 5 s (the probe, a renewal's claim and timeout).
func (f *faultDC) recovers(t *testing.T, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		o := f.send(t, key)
		if o.code == http.StatusOK && o.source == "redis" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger answering again for 5 s: still %s", o)
		}
		time.Sleep(50 * time.Millisecond) // polling the recovery, not crossing a window
	}
}

// TestGlobalRedisDatacenterStoreDown: the data centre's own Redis down
// under a global ceiling kept in a ledger: fail closed and fail local
// answer 503 (fail local's in-process store holds no share of the ceiling;
// it used to refuse with 429 rate_limited and a RateLimit header saying
// the global remaining was 0), fail open passes.
func TestGlobalRedisDatacenterStoreDown(t *testing.T) {
	t.Parallel()
	ledger := redistest.Start(t)
	for _, fail := range []string{"closed", "local", "open"} {
		t.Run(fail, func(t *testing.T) {
			t.Parallel()
			f := newFaultDC(t, ledger, fail)
			passed(t, "before", f.send(t, "k"), "redis")
			f.dc.Kill()
			for _, key := range []string{"k", "new"} {
				for i := range 3 {
					what := fmt.Sprintf("the data centre's Redis down, key %s, request %d", key, i+1)
					o := f.send(t, key)
					if fail == "open" {
						passed(t, what, o, "fail_open")
					} else {
						unavailable(t, what, o)
					}
				}
			}
		})
	}
}

// TestGlobalRedisLedgerStalledFailClosed: the ledger stalled (cut off, its
// calls hang until their timeout) while an identity's share is spent, under
// fail closed, as the table says: while the renewal the requests wait for
// has been out less than the ledger's timeout (300 ms here) and no call of
// the ledger failed, the ledger may be only slow: 429, Retry-After the
// renewal's lead (1 s); from then on 503 at once (it used to be 429 until
// the node's renewal timed out, then 503 from the first refusal, a slow
// ledger's included).
func TestGlobalRedisLedgerStalledFailClosed(t *testing.T) {
	t.Parallel()
	ledger := redistest.Start(t)
	f := newFaultDC(t, ledger, "closed")
	passed(t, "before", f.send(t, "k"), "redis")
	f.proxy.Cut()
	var first faultOutcome
	for range 40 {
		o := f.send(t, "k")
		if o.code == http.StatusOK {
			continue // a unit the share still held
		}
		first = o
		break
	}
	if first.code == 0 {
		t.Fatal("40 requests admitted with the ledger stalled and a ceiling of 20")
	}
	// Refused (the renewal within the timeout) until the fail mode, which
	// comes once the renewal has been out the timeout.
	o, refused := first, 0
	for deadline := time.Now().Add(3 * time.Second); o.code != http.StatusServiceUnavailable; o = f.send(t, "k") {
		if o.code != http.StatusTooManyRequests || o.retry != "1" || o.source != "redis" {
			t.Fatalf("the ledger stalled, the share spent, before the timeout: %s; want 429, Retry-After 1 (the lead), or 503", o)
		}
		refused++
		if time.Now().After(deadline) {
			t.Fatalf("the ledger stalled 3 s (timeout 300 ms): still %s", o)
		}
		time.Sleep(20 * time.Millisecond) // polling for the timeout to pass, not crossing a window
	}
	t.Logf("%d refused (429) before the fail mode", refused)
	unavailable(t, "the ledger stalled, the renewal out its timeout", o)
	for i := range 3 {
		unavailable(t, fmt.Sprintf("the ledger stalled, after the first 503 (request %d)", i+1), f.send(t, "k"))
	}
}
