package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
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
// API. During a reload a name briefly has the old and the new handler; the
// newest is listed last.
var registry = struct {
	sync.Mutex
	byName map[string][]*Handler
}{byName: map[string][]*Handler{}}

func register(h *Handler) {
	registry.Lock()
	registry.byName[h.Name] = append(registry.byName[h.Name], h)
	registry.Unlock()
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

// AdminAPI is the admin endpoint of sliding_ratelimit, on Caddy's admin
// listener:
//
//	GET    /sliding_ratelimit/                      the limiters
//	GET    /sliding_ratelimit/<name>?key=K&region=R[&limit=N] usage of a key, nothing consumed
//	DELETE /sliding_ratelimit/<name>?key=K&region=R reset the key (and its global ceiling)
//
// key is the identity as the limiter's key template resolves for the
// client (e.g. the API key); region as its region template resolves.
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
	Name        string `json:"name"`
	Algorithm   string `json:"algorithm"`
	Limit       Amount `json:"limit"`
	GlobalLimit Amount `json:"global_limit,omitempty"`
	Window      string `json:"window"`
	Key         string `json:"key"`
	Region      string `json:"region,omitempty"`
	Store       string `json:"store"`
	Fail        string `json:"fail"`
	DryRun      bool   `json:"dry_run,omitempty"`
	Instances   int    `json:"instances"`
}

// usageInfo is a key's usage.
type usageInfo struct {
	Limiter    string      `json:"limiter"`
	Key        string      `json:"key"`
	Region     string      `json:"region,omitempty"`
	Allowed    bool        `json:"allowed"`
	Count      int64       `json:"count"`
	Limit      int64       `json:"limit"`
	Remaining  int64       `json:"remaining"`
	RetryAfter int64       `json:"retry_after"`
	Global     *usageGlobe `json:"global,omitempty"`
}

type usageGlobe struct {
	Count     int64 `json:"count"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(r.URL.Path, "/sliding_ratelimit/")
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
		var limit int64
		if q.Has("limit") {
			n, err := parsePositive(q.Get("limit"))
			if err != nil {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("limit must be a positive integer")}
			}
			limit = n
		}
		res, err := h.peek(key, region, limit)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("store: %w", err)}
		}
		u := usageInfo{
			Limiter: name, Key: key, Region: region, Allowed: res.Allowed,
			Count: res.Bucket.Count, Limit: res.Bucket.Limit, Remaining: res.Bucket.Remaining,
			RetryAfter: retryAfterSeconds(&res),
		}
		if h.hasGlobal {
			u.Global = &usageGlobe{Count: res.Global.Count, Limit: res.Global.Limit, Remaining: res.Global.Remaining}
		}
		return writeJSON(w, u)
	case http.MethodDelete:
		keys := []string{h.keys.Bucket(key, h.Region != "", region)}
		if h.hasGlobal {
			keys = append(keys, h.keys.Global(key))
		}
		// Every live instance of the limiter forgets its cached denials
		// and fail-local state; the store is reset once.
		for _, x := range hs {
			if x.denyCache != nil {
				x.denyCache.Forget(keys...)
			}
			if x.local != nil {
				_ = x.local.Reset(ctx, keys...)
			}
		}
		var store limiter.Store = h.store
		if h.breaker != nil {
			store = h.breaker.Store() // an operator's reset bypasses an open circuit
		}
		if err := store.Reset(ctx, keys...); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("store: %w", err)}
		}
		return writeJSON(w, map[string]any{"limiter": name, "key": key, "region": region, "reset": true})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("GET or DELETE")}
}

func listLimiters() []limiterInfo {
	registry.Lock()
	defer registry.Unlock()
	out := make([]limiterInfo, 0, len(registry.byName))
	for name, hs := range registry.byName {
		h := hs[len(hs)-1]
		out = append(out, limiterInfo{
			Name: name, Algorithm: h.Algorithm, Limit: h.Limit, GlobalLimit: h.GlobalLimit,
			Window: time.Duration(h.Window).String(), Key: h.Key, Region: h.Region,
			Store: h.source, Fail: h.Fail, DryRun: h.DryRun, Instances: len(hs),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards.
var _ caddy.AdminRouter = (*AdminAPI)(nil)
