package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// registry lists the provisioned handlers by limiter name, for the admin
// API and the metrics read at scrape time. During a reload a name briefly
// has the old and the new handler; the newest is listed last.
var registry = struct {
	sync.Mutex
	byName map[string][]*Handler
}{byName: map[string][]*Handler{}}

// register adds h, refusing a second handler of one config under the same
// name unless it is the same limiter (the same settings): two with
// different settings would share keys and corrupt each other's counts. It
// reports whether h is the first of its name in its config. (A Caddyfile
// is held to more when it is adapted: two blocks under one name must have
// given it on purpose; one block in several servers is one limiter.)
func register(h *Handler) (first bool, err error) {
	registry.Lock()
	defer registry.Unlock()
	first = true
	for _, x := range registry.byName[h.Name] {
		if x.rt.configID != h.rt.configID {
			continue
		}
		first = false
		if x.rt.fingerprt == h.rt.fingerprt {
			continue
		}
		if h.Name == DefaultName {
			return false, cfgErr("name", "two sliding_ratelimit handlers with different settings are left at the default name %q: give each its own name (name <string>), or they would share one budget", DefaultName)
		}
		return false, cfgErr("name", "two sliding_ratelimit handlers are named %q with different settings: give each its own name (the same name means the same limiter and one budget)", h.Name)
	}
	registry.byName[h.Name] = append(registry.byName[h.Name], h)
	return first, nil
}

// predecessor is the newest live handler of h's name from another config:
// the one a reload replaces.
func predecessor(h *Handler) *Handler {
	registry.Lock()
	defer registry.Unlock()
	hs := registry.byName[h.Name]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].rt.configID != h.rt.configID {
			return hs[i]
		}
	}
	return nil
}

func unregister(h *Handler) {
	registry.Lock()
	defer registry.Unlock()
	hs := registry.byName[h.Name]
	for i, x := range hs {
		if x == h {
			hs = append(hs[:i:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(registry.byName, h.Name)
	} else {
		registry.byName[h.Name] = hs
	}
}

// handlersNamed returns the live handlers of a limiter, newest last.
func handlersNamed(name string) []*Handler {
	registry.Lock()
	defer registry.Unlock()
	return append([]*Handler(nil), registry.byName[name]...)
}

// liveHandlers returns the newest handler of every limiter.
func liveHandlers() []*Handler {
	registry.Lock()
	defer registry.Unlock()
	out := make([]*Handler, 0, len(registry.byName))
	for _, hs := range registry.byName {
		out = append(out, hs[len(hs)-1])
	}
	return out
}

// AdminAPI is the admin endpoint of sliding_ratelimit, on Caddy's admin
// listener:
//
//	GET    /sliding_ratelimit/                       the limiters
//	GET    /sliding_ratelimit/<name>?key=K[&region=R] what K's next request would get, nothing consumed
//	DELETE /sliding_ratelimit/<name>?key=K[&region=R] reset K (its windows, global ceiling and ban), on every node
//	GET    /sliding_ratelimit/<name>/top[?n=10]       the keys this node denied most (and saw cross warn_at most) lately
//	PUT, GET, DELETE /sliding_ratelimit/<name>/override?key=K...  K's temporary override (admin_override.go)
//
// key is the identity as the limiter's key template resolves for the
// client (e.g. the API key); region as its region template resolves. A
// limiter whose limit, cost or max_concurrent is a placeholder needs the
// client's values in GET (&limit=, &global_limit=, &cost=,
// &max_concurrent=; several limits: &limit=10,1000 in order). A trailing
// slash is accepted.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.sliding_ratelimit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: "/sliding_ratelimit/",
		Handler: caddy.AdminHandlerFunc(a.serve),
	}}
}

// limiterInfo is one limiter in the listing.
type limiterInfo struct {
	Name      string       `json:"name"`
	Algorithm string       `json:"algorithm"`
	Windows   []windowInfo `json:"windows"`
	Key       string       `json:"key"`
	Region    string       `json:"region,omitempty"`
	Store     string       `json:"store"`
	// Datacenter is this node's, with global_redis.
	Datacenter string     `json:"datacenter,omitempty"`
	Fail       string     `json:"fail"`
	Ban        *BanConfig `json:"ban,omitempty"`
	DryRun     bool       `json:"dry_run,omitempty"`
	Instances  int        `json:"instances"`
}

// windowInfo is one window: its limit (a number, or the placeholder that
// gives it) and its length.
type windowInfo struct {
	Policy string `json:"policy"`
	Limit  Amount `json:"limit"`
	Window string `json:"window"`
	Global bool   `json:"global,omitempty"`
}

// usageInfo is what a key's next request would get.
type usageInfo struct {
	Limiter string `json:"limiter"`
	Key     string `json:"key"`
	KeyHash string `json:"key_hash"`
	Region  string `json:"region,omitempty"`
	// RegionTemplate is the limiter's region template, when it counts per
	// region: with no region asked for, the answer is the bucket of the
	// requests whose region is empty.
	RegionTemplate string        `json:"region_template,omitempty"`
	Allowed        bool          `json:"allowed"`
	Outcome        string        `json:"outcome"`
	RetryAfter     int64         `json:"retry_after"`
	Banned         bool          `json:"banned,omitempty"`
	BanLeft        int64         `json:"ban_left,omitempty"`
	InFlight       *int64        `json:"in_flight,omitempty"`
	Windows        []windowUsage `json:"windows"`
	// Global is, with global_redis, this node's standing with the ledger
	// and each data centre's share of the key's global ceiling.
	Global *globalInfo `json:"global,omitempty"`
}

// globalInfo is the global ceiling across data centres, for one key: this
// node's view (GlobalState) and the ledger's (Shares).
type globalInfo struct {
	// Datacenter is this node's; Static whether it is on its static
	// share (cut off from the ledger, fail local); Datacenters how many
	// the ledger knows; RoundTripMS the ledger's round trip, an average.
	Datacenter  string  `json:"datacenter"`
	Static      bool    `json:"static"`
	Datacenters int64   `json:"datacenters"`
	RoundTripMS float64 `json:"round_trip_ms"`
	// Shares are each data centre's share of the key's ceiling, as the
	// ledger sees it; SharesError why the ledger did not tell.
	Shares      []shareInfo `json:"shares"`
	SharesError string      `json:"shares_error,omitempty"`
	// Admitted is what every data centre admitted in the longest global
	// window (the sum of the shares' admitted); Unspent what this data
	// centre holds of its grants, not used.
	Admitted int64 `json:"admitted"`
	Unspent  int64 `json:"unspent"`

	use limiter.GlobalUse
}

// shareInfo is one data centre's part of a key's global ceiling: Held,
// the units granted it and not ended; Counted, the units counted in the
// longest global window (granted, counted as used until what was not used
// comes back); Admitted, the units of those it admitted (this data
// centre's exact, another's as it last told the ledger); Rate, the demand
// it last reported (units per second).
type shareInfo struct {
	Datacenter string `json:"datacenter"`
	Held       int64  `json:"held"`
	Counted    int64  `json:"counted"`
	Admitted   int64  `json:"admitted"`
	Rate       int64  `json:"rate"`
}

// resetInfo is the answer of a reset.
type resetInfo struct {
	Limiter        string `json:"limiter"`
	Key            string `json:"key"`
	KeyHash        string `json:"key_hash"`
	Region         string `json:"region"`
	RegionTemplate string `json:"region_template,omitempty"` // as in usageInfo
	Reset          bool   `json:"reset"`
	// Windows are the windows reset: the region's, and the global
	// ceiling's (the key's count across every region); Ban that the key's
	// ban was lifted (the limiter has one). Requests in flight keep their
	// places, and overrides stay.
	Windows            []windowInfo `json:"windows"`
	Ban                bool         `json:"ban,omitempty"`
	OtherNodesNotified bool         `json:"other_nodes_notified"`
	// Ledger: with global_redis, the key's grants in the ledger were
	// forgotten too (its count in the global ceiling, for every data
	// centre); LedgerError why not, or, beside Ledger, that its replicas
	// did not acknowledge it (a failover may lose it). OtherDatacentersTold: the other data
	// centres that held a share of the key, told by the ledger to drop it
	// (each does within a recall's round, 250 ms, and a round trip).
	Ledger               bool   `json:"ledger,omitempty"`
	LedgerError          string `json:"ledger_error,omitempty"`
	OtherDatacentersTold int64  `json:"other_datacenters_told,omitempty"`
}

type windowUsage struct {
	Policy    string `json:"policy"`
	Global    bool   `json:"global,omitempty"`
	Count     int64  `json:"count"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Reset     int64  `json:"reset"`
}

// serve dispatches /sliding_ratelimit/[<name>[/<resource>]].
func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	path := strings.Trim(strings.TrimPrefix(r.URL.Path, "/sliding_ratelimit/"), "/")
	name, resource, _ := strings.Cut(path, "/")
	if name == "" {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("GET only")}
		}
		return writeJSON(w, listLimiters())
	}
	hs := handlersNamed(name)
	if len(hs) == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no limiter named '%s'", name)}
	}
	switch resource {
	case "":
		return serveKey(w, r, name, hs)
	case "top":
		return serveTop(w, r, name, hs[len(hs)-1])
	case "override":
		return serveOverride(w, r, name, hs[len(hs)-1])
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("limiter '%s' has no '%s' (it has: top, override)", name, resource)}
}

// serveTop answers GET /sliding_ratelimit/<name>/top[?n=10]: the n keys
// (1 to 1024, default 10) with the most denials, and the n with the most
// near-limit crossings, on this node over the last 5 to 10 minutes.
func serveTop(w http.ResponseWriter, r *http.Request, name string, h *Handler) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("GET only")}
	}
	n := 10
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > topCounters {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("n must be an integer from 1 to %d, got '%s'", topCounters, v)}
		}
	}
	return writeJSON(w, h.rt.top.report(name, n, h.LogKey, h.rt.now()))
}

// serveKey answers GET (what K's next request would get) and DELETE (reset
// K) of /sliding_ratelimit/<name>?key=K[&region=R].
func serveKey(w http.ResponseWriter, r *http.Request, name string, hs []*Handler) error {
	h := hs[len(hs)-1]
	q := r.URL.Query()
	if !q.Has("key") {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("query parameter 'key' is required (the identity, as the key template resolves)")}
	}
	key, region := q.Get("key"), q.Get("region")
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()

	switch r.Method {
	case http.MethodGet:
		in, err := h.adminInput(q)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		d, err := h.rt.lim.Peek(ctx, in)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("store: %w", err)}
		}
		u := usageInfo{
			Limiter: name, Key: key, KeyHash: keyHash(key), Region: d.Region, RegionTemplate: h.Region, Allowed: d.Outcome == limiter.OutcomeAllowed,
			Outcome: d.Outcome.String(), RetryAfter: retryAfterSeconds(&d), Banned: d.Banned, BanLeft: ceilSeconds(d.BanLeft),
		}
		if d.InFlight >= 0 {
			u.InFlight = &d.InFlight
		}
		for _, w := range d.Windows {
			u.Windows = append(u.Windows, windowUsage{Policy: w.Policy, Global: w.Global, Count: w.Count,
				Limit: w.Limit, Remaining: w.Remaining, Reset: ceilSeconds(w.Reset)})
		}
		u.Global = globalUsage(ctx, h, in)
		u.countAdmitted(&d)
		return writeJSON(w, u)
	case http.MethodDelete:
		ri := resetInfo{Limiter: name, Key: key, KeyHash: keyHash(key), Region: region, RegionTemplate: h.Region,
			Reset: true, Windows: windowInfos(h), Ban: h.Ban != nil}
		if h.rt.ledger != nil {
			// The ledger once, first: every data centre's grants of the key.
			// Then this data centre's share, below: a renewal in flight
			// that asked the ledger before its reset deposits into no share
			// reset after it (a deposit into another incarnation than its
			// renewal read changes nothing), and one that reads the share
			// after its reset asks the ledger after the ledger's.
			// A reset the ledger's replicas did not acknowledge was carried
			// out: said as done, with the error.
			n, _, err := h.rt.lim.ResetGlobal(ctx, key)
			if err == nil || errors.Is(err, limiter.ErrResetNotDurable) {
				ri.Ledger, ri.OtherDatacentersTold = true, n
			}
			if err != nil {
				ri.LedgerError = err.Error()
			}
		}
		// Every live instance of the limiter on this node; the store once;
		// the other nodes through the store's notices.
		for i, x := range hs {
			n, err := x.rt.lim.Reset(ctx, key, region)
			if err != nil {
				if ri.Ledger {
					err = fmt.Errorf("%w (the ledger was reset: retry the reset)", err)
				}
				return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("store: %w", err)}
			}
			if i == len(hs)-1 {
				ri.OtherNodesNotified = n
			}
		}
		return writeJSON(w, ri)
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("GET or DELETE")}
}

// globalUsage is the key's global ceiling across data centres (nil
// without global_redis): a ledger that does not answer is said, not a
// failed GET (that is when an operator looks).
//
// Datacenters is how many the ledger lists (this node's count, read at its
// last ledger call, when the ledger does not answer).
func globalUsage(ctx context.Context, h *Handler, in *limiter.Input) *globalInfo {
	st, ok := h.rt.lim.GlobalState()
	if !ok {
		return nil
	}
	g := &globalInfo{Datacenter: st.Datacenter, Static: st.Static, Datacenters: st.Datacenters,
		RoundTripMS: float64(st.RoundTrip.Microseconds()) / 1000, Shares: []shareInfo{}}
	use, _, err := h.rt.lim.GlobalUse(ctx, in)
	if err != nil {
		g.SharesError = err.Error()
		return g
	}
	for _, s := range use.Shares {
		g.Shares = append(g.Shares, shareInfo{Datacenter: s.Datacenter, Held: s.Held, Counted: s.Counted, Admitted: s.Admitted, Rate: s.Rate})
	}
	g.Datacenters = int64(len(use.Shares))
	g.Admitted, g.Unspent, g.use = use.Admitted, use.Unspent, use
	return g
}

// countAdmitted makes the count of the longest global window what every
// data centre admitted in it (the ledger's view, this data centre's
// exact), not the limit less what this data centre may still admit, and
// its remaining what this data centre's requests can rely on now: the
// ledger's room and what this data centre holds unspent.
func (u *usageInfo) countAdmitted(d *limiter.Decision) {
	if u.Global == nil || u.Global.SharesError != "" {
		return
	}
	var longest int64
	for _, w := range d.Windows {
		if w.Global {
			longest = max(longest, w.Seconds)
		}
	}
	for i, w := range d.Windows {
		if w.Global && w.Seconds == longest && i < len(u.Windows) {
			u.Windows[i].Count = u.Global.Admitted
			if !w.Denied {
				u.Windows[i].Remaining = u.Global.use.Remaining(w.Limit)
			}
		}
	}
}

// adminInput is the Input of a key as the admin GET asks about it: static
// values from the configuration, placeholders from the query, and a 400
// that names every placeholder value the query lacks.
func (h *Handler) adminInput(q url.Values) (*limiter.Input, error) {
	in := &limiter.Input{Identity: q.Get("key"), Region: q.Get("region")}
	var missing []string
	take := func(param string, as []amount) []int64 {
		var vals []string
		if q.Has(param) {
			vals = strings.Split(q.Get(param), ",")
		}
		var out []int64
		dyn := 0
		for _, a := range as {
			if a.tmpl == "" {
				out = append(out, a.static)
				continue
			}
			if dyn >= len(vals) {
				missing = append(missing, fmt.Sprintf("%s (%s)", param, a.tmpl))
				out = append(out, 1)
				continue
			}
			n, err := parsePositive(vals[dyn])
			if err != nil {
				missing = append(missing, fmt.Sprintf("%s (%s, got '%s')", param, a.tmpl, vals[dyn]))
			}
			out = append(out, n)
			dyn++
		}
		return out
	}
	in.Limits = take("limit", h.rt.limits)
	in.GlobalLimits = take("global_limit", h.rt.globals)
	if c := take("cost", []amount{h.rt.cost}); len(c) == 1 {
		in.Cost = c[0]
	}
	if h.MaxConcurrent != "" {
		in.MaxConcurrent = take("max_concurrent", []amount{h.rt.concurrent})[0]
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("this limiter's values come from placeholders; give the client's: %s", strings.Join(missing, ", "))
	}
	return in, nil
}

func listLimiters() []limiterInfo {
	registry.Lock()
	defer registry.Unlock()
	out := make([]limiterInfo, 0, len(registry.byName))
	for name, hs := range registry.byName {
		h := hs[len(hs)-1]
		info := limiterInfo{
			Name: name, Algorithm: h.rt.lim.Policy().Algorithm.String(), Key: h.Key, Region: h.Region,
			Store: h.storeName(), Datacenter: h.Datacenter, Fail: h.Fail, Ban: h.Ban, DryRun: h.DryRun, Instances: len(hs),
		}
		info.Windows = windowInfos(h)
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// windowInfos lists h's windows, the region's then the global ceiling's,
// with their limits as configured: a number, or the placeholder that gives
// it per request.
func windowInfos(h *Handler) []windowInfo {
	// The windows' names and lengths do not depend on the limits: 1 stands
	// for a limit a placeholder gives.
	in := staticInput(h)
	for i, a := range h.rt.limits {
		if a.tmpl != "" {
			in.Limits[i] = 1
		}
	}
	for i, a := range h.rt.globals {
		if a.tmpl != "" {
			in.GlobalLimits[i] = 1
		}
	}
	ws, err := h.rt.lim.Windows(in)
	if err != nil {
		return nil
	}
	_, as, _ := h.windows(false)
	_, gs, _ := h.windows(true)
	all := append(as, gs...)
	var out []windowInfo
	for i, w := range ws {
		if i < len(all) {
			out = append(out, windowInfo{Policy: w.Policy, Limit: all[i], Window: w.Window.Label(), Global: w.Global})
		}
	}
	return out
}

// storeName is "redis" or "memory".
func (h *Handler) storeName() string {
	if h.Redis != nil {
		return "redis"
	}
	return "memory"
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards.
var _ caddy.AdminRouter = (*AdminAPI)(nil)
