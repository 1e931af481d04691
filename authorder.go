package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A limiter keyed on the authenticated user ({http.auth.user.id}) must run
// after the authentication handler that sets it. In a Caddyfile it runs
// before basic_auth (its directive order, so that a flood of anonymous
// requests is turned away before it costs a password hash): beside
// basic_auth in one site, {http.auth.*} is empty when the limiter reads
// it, every user shares one budget and a request without credentials gets
// 429 instead of 401. The config is refused, not warned about: the order
// of two handlers in one route is fixed when it loads, so such a
// placeholder is empty for every request, there is no config where that is
// meant, and a warning at start is what went unseen.

// authPrefix is the placeholders an authentication handler sets.
const authPrefix = "http.auth."

// checkAuthOrder refuses a limiter whose key, region, limits, cost or
// max_concurrent read {http.auth.*} while it runs before an authentication
// handler in its route, with the fix.
func (h *Handler) checkAuthOrder() error {
	field, tmpl, name := h.authPlaceholder()
	if name == "" || h.rt.ctx.Context == nil {
		return nil
	}
	for _, rl := range configRouteLists(h.rt.ctx) {
		if authAfter(rawRoutes(rl), h.isThis) {
			return cfgErr(field, "%s %s: {%s} is set by the authentication handler (basic_auth, or a plugin's provider such as JWT), which runs after this limiter in its route: "+
				"it is empty here, so every user would share one budget and a request without credentials would get 429, not 401. "+
				"Run the authentication first: put both in a route block (route { basic_auth ... then sliding_ratelimit ... }), or set the global option order sliding_ratelimit after basic_auth",
				field, tmpl, name)
		}
	}
	return nil
}

// authPlaceholder is the first field of h that reads an {http.auth.*}
// placeholder: its name, template and the placeholder ("" if none).
func (h *Handler) authPlaceholder() (field, tmpl, name string) {
	fields := []struct{ f, t string }{{"key", h.Key}, {"region", h.Region}, {"limit", string(h.Limit)}}
	for i, l := range h.Limits {
		fields = append(fields, struct{ f, t string }{fmt.Sprintf("limits[%d]", i), string(l.Limit)})
	}
	fields = append(fields, struct{ f, t string }{"global_limit", string(h.GlobalLimit)})
	for i, l := range h.GlobalLimits {
		fields = append(fields, struct{ f, t string }{fmt.Sprintf("global_limits[%d]", i), string(l.Limit)})
	}
	fields = append(fields, struct{ f, t string }{"cost", string(h.Cost)}, struct{ f, t string }{"max_concurrent", string(h.MaxConcurrent)})
	for _, f := range fields {
		for _, p := range templatePlaceholders(f.t) {
			if strings.HasPrefix(p, authPrefix) {
				return f.f, f.t, p
			}
		}
	}
	return "", "", ""
}

// isThis reports whether a handler's JSON is this limiter's (its name and
// key: a limiter in several routes is checked in each).
func (h *Handler) isThis(m map[string]any) bool {
	if m["handler"] != "sliding_ratelimit" {
		return false
	}
	name, _ := m["name"].(string)
	if name == "" {
		name = DefaultName
	}
	key, _ := m["key"].(string)
	if key == "" {
		key = DefaultKey
	}
	return name == h.Name && key == h.Key
}

// rawRoutes is a route list as JSON values: the routes still to be
// provisioned (this limiter's, those after it, and what they enclose) as
// the config gives them; one provisioned already (before this limiter's)
// as a route without handlers.
func rawRoutes(rl caddyhttp.RouteList) []any {
	out := make([]any, 0, len(rl))
	for _, r := range rl {
		var hs []any
		for _, raw := range r.HandlersRaw {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				hs = append(hs, v)
			}
		}
		out = append(out, map[string]any{"handle": hs})
	}
	return out
}

// authAfter reports whether, in a list of routes (JSON) or in one they
// enclose, a handler isThis is followed by an authentication handler:
// later in its route, in a later route, or inside a later handler (a
// subroute).
func authAfter(routes []any, isThis func(map[string]any) bool) bool {
	var seq []map[string]any
	for _, r := range routes {
		rm, _ := r.(map[string]any)
		hs, _ := rm["handle"].([]any)
		for _, hd := range hs {
			if m, ok := hd.(map[string]any); ok {
				seq = append(seq, m)
			}
		}
	}
	seen := false
	for _, m := range seq {
		if seen && hasAuth(m) {
			return true
		}
		if isThis(m) {
			seen = true
		}
		if sub, ok := m["routes"].([]any); ok && authAfter(sub, isThis) {
			return true
		}
	}
	return false
}

// hasAuth reports whether a handler's JSON is, or encloses, an
// authentication handler.
func hasAuth(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		if x["handler"] == "authentication" {
			return true
		}
		for _, c := range x {
			if hasAuth(c) {
				return true
			}
		}
	case []any:
		for _, c := range x {
			if hasAuth(c) {
				return true
			}
		}
	}
	return false
}
