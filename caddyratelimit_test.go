package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// convertedExample is docs/migrating.md's conversion of caddy-ratelimit's
// main example.
const convertedExample = "examples/caddy-ratelimit.Caddyfile"

// caddyRatelimitSource is caddy-ratelimit's README example, as written
// there (docs/migrating.md quotes this file as the config to convert).
const caddyRatelimitSource = "testdata/caddy-ratelimit.Caddyfile"

// caddyRatelimitExample reads caddy-ratelimit's example into the model: its
// zones (static_example: GET requests, one key for everybody, 100 per
// minute; dynamic_example: per client IP, 2 per 5 s) with their keys,
// events, windows and method matchers. distributed is left out: the model is
// the in-process limiter, which is what distributed approximates.
func caddyRatelimitExample(t *testing.T) *refHandler {
	t.Helper()
	src, err := os.ReadFile(caddyRatelimitSource)
	if err != nil {
		t.Fatal(err)
	}
	var zones []*refZone
	d := caddyfile.NewTestDispenser(string(src))
	for d.Next() {
		if d.Val() != "rate_limit" {
			continue
		}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			switch d.Val() {
			case "zone":
				if !d.NextArg() {
					t.Fatalf("%s:%d: zone without a name", caddyRatelimitSource, d.Line())
				}
				z := &refZone{name: d.Val()}
				for zn := d.Nesting(); d.NextBlock(zn); {
					opt := d.Val()
					switch opt {
					case "match":
						for mn := d.Nesting(); d.NextBlock(mn); {
							if d.Val() != "method" {
								t.Fatalf("%s:%d: matcher %s is not modelled", caddyRatelimitSource, d.Line(), d.Val())
							}
							methods := d.RemainingArgs()
							z.match = func(r refRequest) bool { return slices.Contains(methods, r.method) }
						}
						continue
					}
					if !d.NextArg() {
						t.Fatalf("%s:%d: %s without a value", caddyRatelimitSource, d.Line(), opt)
					}
					switch v := d.Val(); opt {
					case "key":
						z.key = refKey(t, v)
					case "events":
						if z.maxEvents, err = strconv.Atoi(v); err != nil || z.maxEvents < 1 {
							t.Fatalf("%s:%d: events %s", caddyRatelimitSource, d.Line(), v)
						}
					case "window":
						if z.window, err = caddy.ParseDuration(v); err != nil {
							t.Fatalf("%s:%d: window %s: %v", caddyRatelimitSource, d.Line(), v, err)
						}
					default:
						t.Fatalf("%s:%d: zone option %s is not modelled", caddyRatelimitSource, d.Line(), opt)
					}
				}
				if z.key == nil {
					z.key = refKey(t, "") // its default: one key for the zone
				}
				zones = append(zones, z)
			case "distributed":
				for dn := d.Nesting(); d.NextBlock(dn); {
				}
			default:
				t.Fatalf("%s:%d: %s is not modelled", caddyRatelimitSource, d.Line(), d.Val())
			}
		}
	}
	if len(zones) != 2 {
		t.Fatalf("%s: %d zones, want the example's 2", caddyRatelimitSource, len(zones))
	}
	return newRefHandler(zones...)
}

// refKey resolves a zone's key template as caddy-ratelimit does for the
// requests of the comparison: literal text, and {remote_host} (the
// Caddyfile's short form of {http.request.remote.host}).
func refKey(t *testing.T, tmpl string) func(refRequest) string {
	t.Helper()
	if strings.Contains(strings.ReplaceAll(tmpl, "{remote_host}", ""), "{") {
		t.Fatalf("%s: key %s: only {remote_host} is modelled", caddyRatelimitSource, tmpl)
	}
	return func(r refRequest) string { return strings.ReplaceAll(tmpl, "{remote_host}", r.remoteHost) }
}

// chainStep is one handler of the adapted config, with its route's matchers.
type chainStep struct {
	match   caddyhttp.MatcherSets
	handler caddyhttp.MiddlewareHandler
}

// convertedChain loads the converted Caddyfile as Caddy would adapt it and
// returns its handler chain in order, every sliding_ratelimit handler
// provisioned with clock: on the in-process store, or on the Redis at
// redisAddr. suffix makes the limiter names (and so the buckets) the run's
// own; nothing else of the config is changed.
func convertedChain(t *testing.T, clock *testClock, redisAddr, suffix string) []chainStep {
	t.Helper()
	src, err := os.ReadFile(convertedExample)
	if err != nil {
		t.Fatal(err)
	}
	out, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, nil)
	if err != nil {
		t.Fatalf("adapt %s: %v", convertedExample, err)
	}
	for _, w := range warns {
		t.Logf("%s: adapter warning: %s", convertedExample, w.Message)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Apps.HTTP.Servers) != 1 {
		t.Fatalf("%s: want one server, got %d", convertedExample, len(cfg.Apps.HTTP.Servers))
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	var steps []chainStep
	var walk func(routes []json.RawMessage, outer caddyhttp.RawMatcherSets)
	walk = func(routes []json.RawMessage, outer caddyhttp.RawMatcherSets) {
		for _, raw := range routes {
			var r struct {
				caddyhttp.Route
				Handle []json.RawMessage `json:"handle"`
			}
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			// The chain below runs routes in order, each on its matchers:
			// what Caddy does for routes without groups or terminal flags.
			if r.Group != "" || r.Terminal {
				t.Fatalf("%s: route %s has a group or is terminal, which this test does not model", convertedExample, raw)
			}
			if len(outer) > 0 && len(r.MatcherSetsRaw) > 0 {
				t.Fatalf("%s: nested matchers, which this test does not model", convertedExample)
			}
			match := r.MatcherSetsRaw
			if len(match) == 0 {
				match = outer
			}
			for _, hraw := range r.Handle {
				var kind struct {
					Handler string            `json:"handler"`
					Routes  []json.RawMessage `json:"routes"`
				}
				if err := json.Unmarshal(hraw, &kind); err != nil {
					t.Fatal(err)
				}
				if kind.Handler == "subroute" {
					walk(kind.Routes, match)
					continue
				}
				mr := caddyhttp.Route{MatcherSetsRaw: match}
				if err := mr.ProvisionMatchers(ctx); err != nil {
					t.Fatal(err)
				}
				var h caddyhttp.MiddlewareHandler
				if kind.Handler == "sliding_ratelimit" {
					sr := new(Handler)
					if err := json.Unmarshal(hraw, sr); err != nil {
						t.Fatal(err)
					}
					sr.Name += suffix
					if redisAddr == "" {
						sr.Redis = nil
					} else if sr.Redis != nil {
						sr.Redis.URL = "redis://" + redisAddr
					}
					provision(t, sr, clock)
					h = sr
				} else {
					var fields map[string]json.RawMessage
					if err := json.Unmarshal(hraw, &fields); err != nil {
						t.Fatal(err)
					}
					delete(fields, "handler") // the module's name, not its config
					cfgJSON, err := json.Marshal(fields)
					if err != nil {
						t.Fatal(err)
					}
					mod, err := ctx.LoadModuleByID("http.handlers."+kind.Handler, cfgJSON)
					if err != nil {
						t.Fatal(err)
					}
					h = mod.(caddyhttp.MiddlewareHandler)
				}
				steps = append(steps, chainStep{match: mr.MatcherSets, handler: h})
			}
		}
	}
	for _, srv := range cfg.Apps.HTTP.Servers {
		walk(srv.Routes, nil)
	}
	return steps
}

// ourDecision is this plugin's answer, as a client and handle_errors see it.
type ourDecision struct {
	status     int
	retryAfter string
	name       string // {http.sliding_ratelimit.name}
}

// serveChain runs one request through the chain, as Caddy's server would.
func serveChain(t *testing.T, steps []chainStep, req refRequest) ourDecision {
	t.Helper()
	r := httptest.NewRequest(req.method, "http://example.com/", nil)
	r.RemoteAddr = req.remoteHost + ":40000"
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, w, nil)
	var run func(i int) caddyhttp.Handler
	run = func(i int) caddyhttp.Handler {
		return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			for ; i < len(steps); i++ {
				ok, err := steps[i].match.AnyMatchWithError(r)
				if err != nil {
					return err
				}
				if len(steps[i].match) == 0 || ok {
					return steps[i].handler.ServeHTTP(w, r, run(i+1))
				}
			}
			return nil
		})
	}
	err := run(0).ServeHTTP(w, r)
	d := ourDecision{status: w.Code, retryAfter: w.Header().Get("Retry-After")}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		d.status = he.StatusCode
	} else if err != nil {
		t.Fatalf("request at %s: %v", req.at.Format(time.RFC3339Nano), err)
	}
	d.name, _ = repl.GetString(phPrefix + "name")
	return d
}

// compareDecision fails the test unless this plugin and caddy-ratelimit
// decided req alike: both allowed, or both refused by the same zone with the
// same Retry-After. The one intended difference is Retry-After's rounding
// (see caddyratelimit_ref_test.go): this plugin's is ceil(wait), at least 1;
// caddy-ratelimit's is one second more when its wait is a whole, odd number
// of seconds.
func compareDecision(t *testing.T, i int, req refRequest, ref refDecision, ours ourDecision) {
	t.Helper()
	what := fmt.Sprintf("request %d (%s %s at +%s)", i, req.method, req.remoteHost, req.at.Sub(testEpoch))
	if ref.allowed {
		if ours.status != http.StatusOK {
			t.Fatalf("%s: caddy-ratelimit allows, this plugin answers %d (%s, Retry-After %s)", what, ours.status, ours.name, ours.retryAfter)
		}
		return
	}
	if ours.status != http.StatusTooManyRequests {
		t.Fatalf("%s: caddy-ratelimit refuses (zone %s, wait %s), this plugin answers %d", what, ref.zone, ref.wait, ours.status)
	}
	if ours.name != ref.zone {
		t.Fatalf("%s: refused by %s here, by zone %s in caddy-ratelimit", what, ours.name, ref.zone)
	}
	want := int64(math.Ceil(ref.wait.Seconds()))
	if ref.wait%time.Second == 0 && (ref.wait/time.Second)%2 == 1 {
		if ref.retryAfter != strconv.FormatInt(want+1, 10) {
			t.Fatalf("%s: the model's Retry-After %s for a wait of %s breaks its documented rounding", what, ref.retryAfter, ref.wait)
		}
	} else if ref.retryAfter != strconv.FormatInt(want, 10) {
		t.Fatalf("%s: the model's Retry-After %s for a wait of %s breaks its documented rounding", what, ref.retryAfter, ref.wait)
	}
	if want < 1 {
		want = 1
	}
	if ours.retryAfter != strconv.FormatInt(want, 10) {
		t.Fatalf("%s: Retry-After %s here, want %d (caddy-ratelimit's wait %s, its header %s)", what, ours.retryAfter, want, ref.wait, ref.retryAfter)
	}
}

// testEpoch starts every sequence, on a whole second.
var testEpoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// burstySequence makes n requests from 24 clients: bursts of up to 8
// requests within milliseconds, pauses of up to 0.4 s and, now and then,
// pauses around the 5 s edge or past both windows; most GET, some POST
// (which static_example does not count). Enough clients pass
// dynamic_example to fill static_example too. Times are whole microseconds,
// this plugin's resolution.
func burstySequence(seed uint64, n int) []refRequest {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var clients []string
	for i := range 12 {
		clients = append(clients, fmt.Sprintf("192.0.2.%d", i+1), fmt.Sprintf("2001:db8::%x", i+1))
	}
	at := testEpoch
	var seq []refRequest
	for len(seq) < n {
		switch p := rng.IntN(200); {
		case p == 0:
			at = at.Add(time.Duration(60+rng.IntN(10)) * time.Second) // past both windows
		case p < 9:
			at = at.Add(time.Duration(4_900_000+rng.IntN(200_000)) * time.Microsecond) // around the 5 s edge
		default:
			at = at.Add(time.Duration(rng.IntN(400_000)) * time.Microsecond)
		}
		client := clients[rng.IntN(len(clients))]
		for range 1 + rng.IntN(8) {
			method := http.MethodGet
			if rng.IntN(5) == 0 {
				method = http.MethodPost
			}
			seq = append(seq, refRequest{at: at, method: method, remoteHost: client})
			at = at.Add(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
	}
	return seq[:n]
}

// runComparison sends seq through both and compares every decision. A
// request that would land exactly window after the oldest event of a full
// ring, the one instant where the two differ (TestCaddyRatelimitBoundary),
// is moved 1 µs later first; it reports how many were.
func runComparison(t *testing.T, seq []refRequest, redisAddr string) (moved int) {
	t.Helper()
	clock := newTestClock()
	suffix := "-" + uniqueName()
	steps := convertedChain(t, clock, redisAddr, suffix)
	ref := caddyRatelimitExample(t)
	allowed, denied := 0, map[string]int{}
	var last time.Time
	for i, req := range seq {
		if req.at.Before(last) {
			req.at = last
		}
		if ref.atBoundary(req) {
			req.at = req.at.Add(time.Microsecond)
			moved++
		}
		last = req.at
		clock.Set(req.at)
		want := ref.decide(req)
		got := serveChain(t, steps, req)
		got.name = strings.TrimSuffix(got.name, suffix)
		compareDecision(t, i, req, want, got)
		if want.allowed {
			allowed++
		} else {
			denied[want.zone]++
		}
	}
	// The sequence must have exercised both zones, or the comparison says little.
	if allowed == 0 || denied["static_example"] == 0 || denied["dynamic_example"] == 0 {
		t.Fatalf("sequence too tame: %d allowed, refusals by zone %v", allowed, denied)
	}
	t.Logf("%d requests: %d allowed, refused %v, %d moved off an exact window edge", len(seq), allowed, denied, moved)
	return moved
}

// TestComingFromCaddyRatelimit holds docs/migrating.md's conversion of
// caddy-ratelimit's main example to its word: the converted Caddyfile,
// adapted and run by this plugin with an injected clock, decides every
// request of bursty sequences (several clients, GET and POST, bursts at and
// around the window edges, waits past both windows) as caddy-ratelimit's
// limiter does (caddyratelimit_ref_test.go): the same allow or refuse, the
// same zone named ({http.sliding_ratelimit.name} for
// {http.rate_limit.exceeded.name}), the same Retry-After but for the
// documented rounding. On the in-process store (caddy-ratelimit without
// distributed) and on a real Redis (what its distributed does, exactly).
func TestComingFromCaddyRatelimit(t *testing.T) {
	t.Parallel()
	t.Run("scripted", func(t *testing.T) {
		t.Parallel()
		// Two clients; edges of the 5 s window to the microsecond.
		s := func(d time.Duration, method, host string) refRequest {
			return refRequest{at: testEpoch.Add(d), method: method, remoteHost: host}
		}
		const a, b = "192.0.2.1", "192.0.2.2"
		var seq []refRequest
		for range 3 { // a burst of 3: 2 pass, the 3rd waits 5 s
			seq = append(seq, s(0, http.MethodGet, a))
		}
		seq = append(seq,
			s(time.Second, http.MethodGet, a),                    // waits 4 s
			s(1500*time.Millisecond, http.MethodPost, b),         // another client passes
			s(5*time.Second-time.Microsecond, http.MethodGet, a), // 1 µs before the edge
			s(5*time.Second+time.Microsecond, http.MethodGet, a), // 1 µs after: both gone
			s(5*time.Second+time.Microsecond, http.MethodGet, a),
			s(5*time.Second+2*time.Microsecond, http.MethodGet, a), // full again
			s(9*time.Second, http.MethodPost, a),                   // POST is counted by dynamic_example too
		)
		// 100 GETs from 50 clients within a second fill static_example;
		// the 101st is refused by it for everybody, until a minute after
		// the first of them.
		for i := range 100 {
			seq = append(seq, s(20*time.Second+time.Duration(i)*time.Millisecond, http.MethodGet, fmt.Sprintf("203.0.113.%d", i/2)))
		}
		seq = append(seq,
			s(21*time.Second, http.MethodGet, b),  // static_example is full
			s(21*time.Second, http.MethodPost, b), // POST is not its business
			s(80*time.Second-time.Microsecond, http.MethodGet, "198.51.100.9"),
			s(80*time.Second+time.Microsecond, http.MethodGet, "198.51.100.9"),
		)
		for _, store := range []string{"memory", "redis"} {
			t.Run(store, func(t *testing.T) {
				addr := ""
				if store == "redis" {
					addr = redistest.Start(t).Addr()
				}
				if moved := runComparison(t, seq, addr); moved != 0 {
					t.Fatalf("the scripted sequence lands %d requests on an exact window edge", moved)
				}
			})
		}
	})
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run("bursty-"+strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			store, addr := "memory", ""
			if seed%2 == 0 {
				store, addr = "redis", redistest.Start(t).Addr()
			}
			t.Logf("store: %s", store)
			runComparison(t, burstySequence(seed, 1500), addr)
		})
	}
}

// TestCaddyRatelimitBoundary shows the one instant where the two differ, as
// docs/migrating.md says: exactly window after the oldest counted request.
// caddy-ratelimit still counts that request (it frees its slot only when
// MORE than window has passed), computes a wait of 0, and its handler, which
// refuses only on a wait above 0, lets the request through without recording
// it: every request at that instant passes. This plugin's window is
// (now-window, now]: the oldest request has left it, and the requests at that
// instant are admitted and counted like any others, up to the limit.
func TestCaddyRatelimitBoundary(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	steps := convertedChain(t, clock, "", "-"+uniqueName())
	ref := caddyRatelimitExample(t)
	const a = "192.0.2.1"
	send := func(d time.Duration) (refDecision, ourDecision) {
		req := refRequest{at: testEpoch.Add(d), method: http.MethodPost, remoteHost: a}
		clock.Set(req.at)
		return ref.decide(req), serveChain(t, steps, req)
	}
	for i := range 2 {
		if r, o := send(0); !r.allowed || o.status != http.StatusOK {
			t.Fatalf("request %d at 0: caddy-ratelimit allowed=%v, this plugin %d", i+1, r.allowed, o.status)
		}
	}
	var refPassed, oursPassed int
	for range 4 {
		r, o := send(5 * time.Second)
		if r.allowed {
			refPassed++
		}
		if o.status == http.StatusOK {
			oursPassed++
		}
	}
	if refPassed != 4 || oursPassed != 2 {
		t.Fatalf("4 requests exactly 5 s later: caddy-ratelimit passed %d (want 4, unrecorded), this plugin %d (want 2, the limit)", refPassed, oursPassed)
	}
	// 1 µs later caddy-ratelimit's ring still holds the two requests at 0,
	// now more than 5 s old: it admits two more; this plugin holds the two
	// it admitted at 5 s and refuses.
	r, o := send(5*time.Second + time.Microsecond)
	if !r.allowed || o.status != http.StatusTooManyRequests || o.retryAfter != "5" {
		t.Fatalf("1 µs after the edge: caddy-ratelimit allowed=%v (want true), this plugin %d with Retry-After %s (want 429, 5)", r.allowed, o.status, o.retryAfter)
	}
}

// TestCaddyRatelimitDirective: a caddy-ratelimit Caddyfile is refused by
// Caddy itself, before this plugin sees it: its order line names a directive
// nobody registered, and without that line the directive is unrecognized.
// This plugin does not register rate_limit (a Caddy built with both plugins
// would then fail to start), so docs/migrating.md's conversion is the way over.
func TestCaddyRatelimitDirective(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(caddyRatelimitSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, src, want string }{
		{"as written", string(src), "rate_limit is not a registered directive, at Caddyfile:2"},
		{"without order", strings.Replace(string(src), "order rate_limit before basicauth", "", 1), "Caddyfile:7: unrecognized directive: rate_limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.src), map[string]any{"filename": "Caddyfile"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("adapting caddy-ratelimit's example: %v, want %q", err, c.want)
			}
		})
	}
}
