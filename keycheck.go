package slidingratelimit

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	maphandler "github.com/caddyserver/caddy/v2/modules/caddyhttp/map"
	"go.uber.org/zap"
)

// A key that resolves to the same value for every client puts every client
// in one budget: the first clients use it up, and everyone else gets 429.
// Caddy replaces an unknown placeholder with nothing, so a typo in a key
// ({http.request.heder.X-API-Key}) does exactly that, without a word. These
// checks say so: at load, a warning per template that has no per-request
// placeholder or one that nothing provides; per request, a metric and a
// rate-limited log line when the key resolves to nothing.

// emptyKeyLogEvery bounds the log lines about requests whose key resolved
// to nothing: one per limiter per minute.
const emptyKeyLogEvery = time.Minute

// staticPlaceholders are the prefixes of Caddy's placeholders whose value
// does not come from the request: a key made of them alone is one budget.
var staticPlaceholders = []string{"env.", "system.", "time.", "file."}

// setDuringRequest are the prefixes of the placeholders that Caddy's
// standard handlers and matchers set while a request is served (vars,
// regexp matchers, authentication, reverse_proxy, intercept, errors, ...),
// and this handler's own: known, though no request has them before.
var setDuringRequest = []string{
	"http.vars.", "http.regexp.", "http.auth.", "http.reverse_proxy.", "http.intercept.",
	"http.error", "http.matchers.file.", "http.url_pattern.", "http.response.", "http.sliding_ratelimit.",
}

// suggestFamilies and suggestNames are what a near miss is compared with.
var (
	suggestFamilies = []string{
		"http.request.header.", "http.request.cookie.", "http.request.uri.query.", "http.request.tls.",
		"http.request.host.labels.", "http.request.uri.path.", "http.vars.", "http.regexp.", "http.auth.user.", "env.",
	}
	suggestNames = []string{
		"http.vars.client_ip", "http.request.remote", "http.request.remote.host", "http.request.remote.port",
		"http.request.host", "http.request.hostport", "http.request.method", "http.request.uri", "http.request.uri.path",
		"http.request.uri.query", "http.request.scheme", "http.request.proto", "http.request.tls.client.fingerprint",
		"http.request.tls.client.subject", "http.request.tls.server_name", "http.auth.user.id",
	}
)

// templatePlaceholders returns the names of the placeholders in a template,
// read as Caddy's replacer reads them ({name}; \{ and \} are literal).
func templatePlaceholders(tmpl string) []string {
	var names []string
	for i := 0; i < len(tmpl); i++ {
		switch {
		case tmpl[i] == '\\':
			i++ // the escaped character is literal
		case tmpl[i] == '{':
			end := strings.IndexByte(tmpl[i+1:], '}')
			if end < 0 {
				return names
			}
			names = append(names, tmpl[i+1:i+1+end])
			i += end + 1
		}
	}
	return names
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// placeholderKnowledge tells the placeholders a request may have: those
// of Caddy's HTTP server (asked of a real replacer, so the list is the
// running Caddy's), those set while a request is served, and the ones the
// config's map handlers set.
type placeholderKnowledge struct {
	repl     *caddy.Replacer
	provided map[string]bool
}

func newPlaceholderKnowledge(ctx caddy.Context) *placeholderKnowledge {
	r, _ := http.NewRequest(http.MethodGet, "http://localhost/", http.NoBody)
	repl := caddy.NewReplacer()
	caddyhttp.PrepareRequest(r, repl, discardWriter{}, &caddyhttp.Server{})
	return &placeholderKnowledge{repl: repl, provided: providedByConfig(ctx)}
}

// known reports whether a request may have the placeholder.
func (k *placeholderKnowledge) known(name string) (ok bool) {
	if k.provided[name] || hasAnyPrefix(name, setDuringRequest) || hasAnyPrefix(name, staticPlaceholders) {
		return true
	}
	defer func() {
		if recover() != nil { // a provider that needs more of a request than this one has: it knows the name
			ok = true
		}
	}()
	_, ok = k.repl.Get(name)
	return ok
}

// templateProblem is what is wrong with a key or region template.
type templateProblem struct {
	msg         string
	placeholder string
	suggestion  string
}

// checkTemplate finds what would make a key put clients together: no
// placeholder that differs per request (key only), or placeholders nothing
// provides, which resolve to nothing.
func (k *placeholderKnowledge) checkTemplate(tmpl string, isKey bool) []templateProblem {
	var out []templateProblem
	perRequest := false
	for _, name := range templatePlaceholders(tmpl) {
		if !k.known(name) {
			p := templateProblem{placeholder: "{" + name + "}", suggestion: k.suggest(name)}
			p.msg = "placeholder is not one that Caddy or a handler of this config provides: it resolves to nothing"
			if isKey {
				p.msg += ", and every client would share one budget"
			}
			out = append(out, p)
			continue
		}
		if !hasAnyPrefix(name, staticPlaceholders) {
			perRequest = true
		}
	}
	if isKey && !perRequest && len(out) == 0 {
		out = append(out, templateProblem{
			msg:        "has no placeholder that differs per request: every client shares one budget (a limit for the whole site)",
			suggestion: "{client_ip} in a Caddyfile, {http.vars.client_ip} in JSON, for one budget per client",
		})
	}
	return out
}

// warnTemplates logs, once per limiter when the config loads, what is
// wrong with its key and region templates. They are warnings, not errors:
// a key the same for everyone is how a limit for a whole site is written,
// and placeholders are open-ended (a plugin may set its own).
func (h *Handler) warnTemplates() {
	k := newPlaceholderKnowledge(h.rt.ctx)
	for _, t := range []struct {
		sub, tmpl string
	}{{"key", h.Key}, {"region", h.Region}} {
		if t.tmpl == "" {
			continue
		}
		for _, p := range k.checkTemplate(t.tmpl, t.sub == "key") {
			fields := []zap.Field{zap.String("limiter", h.Name), zap.String(t.sub, t.tmpl)}
			if p.placeholder != "" {
				fields = append(fields, zap.String("placeholder", p.placeholder))
			}
			if p.suggestion != "" {
				fields = append(fields, zap.String("did_you_mean", p.suggestion))
			}
			h.rt.logger.Warn(t.sub+" "+p.msg, fields...)
		}
	}
}

// checkAmounts refuses, at load, a limit, global_limit, cost or
// max_concurrent with a placeholder nothing provides. Unlike a key's (a
// warning: one budget for everyone may be meant), such a placeholder
// resolves to nothing, which is not a positive integer: every request
// would be answered 500. A placeholder only a plugin sets can be copied
// into a variable first (vars), read as {http.vars.<name>}.
func (h *Handler) checkAmounts() error {
	type checked struct {
		field, what string
		a           Amount
	}
	list := []checked{{"cost", "cost", h.Cost}, {"max_concurrent", "max_concurrent", h.MaxConcurrent}}
	for _, global := range []bool{false, true} {
		_, as, _ := h.windows(global)
		what := "limit"
		if global {
			what = "global_limit"
		}
		for i, a := range as {
			list = append(list, checked{h.windowField(global, i, false), what, a})
		}
	}
	var k *placeholderKnowledge
	for _, c := range list {
		if !c.a.isDynamic() {
			continue
		}
		if k == nil {
			k = newPlaceholderKnowledge(h.rt.ctx)
		}
		for _, name := range templatePlaceholders(string(c.a)) {
			if k.known(name) {
				continue
			}
			hint := ""
			if s := k.suggest(name); s != "" {
				hint = " (did you mean " + s + "?)"
			}
			return cfgErr(c.field, "%s %s: placeholder {%s} is not one that Caddy or a handler of this config provides: it resolves to nothing, and every request would be answered 500%s%s",
				c.what, c.a, name, hint, amountLine(h.Name, c.field, c.a))
		}
	}
	return nil
}

// suggest is the placeholder a near miss probably meant: a map
// destination or a var of this config at most two edits away (the nearest),
// or else suggestPlaceholder's.
func (k *placeholderKnowledge) suggest(name string) string {
	best, bestDist := "", 3
	for p := range k.provided {
		forms := []string{p}
		if v, ok := strings.CutPrefix(p, "http.vars."); ok {
			forms = append(forms, v, "vars."+v) // a var written bare, or as the Caddyfile's shorthand
		}
		for _, f := range forms {
			if d := editDistance(name, f); d < bestDist || d == bestDist && p < best {
				best, bestDist = p, d
			}
		}
	}
	if best != "" {
		return "{" + best + "}"
	}
	return suggestPlaceholder(name)
}

// suggestPlaceholder returns the placeholder a near miss probably meant:
// the expansion of a Caddyfile shorthand (which JSON does not expand), a
// family or a name at most two edits away; "" when none is close.
func suggestPlaceholder(name string) string {
	seg := caddyfile.Segment{{Text: "{" + name + "}"}}
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&seg)
	if full := seg[0].Text; full != "{"+name+"}" {
		return full
	}
	best, bestDist := "", 3
	for _, f := range suggestFamilies {
		n := strings.Count(f, ".")
		parts := strings.SplitN(name, ".", n+1)
		if len(parts) != n+1 || parts[n] == "" {
			continue
		}
		if d := editDistance(strings.Join(parts[:n], ".")+".", f); d < bestDist {
			best, bestDist = f+parts[n], d
		}
	}
	for _, s := range suggestNames {
		if d := editDistance(name, s); d < bestDist {
			best, bestDist = s, d
		}
	}
	if best == "" {
		return ""
	}
	return "{" + best + "}"
}

// editDistance is the Levenshtein distance of two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// providedByConfig returns the placeholders the map and vars handlers of
// the config being loaded set, wherever they are in the HTTP app's routes (provisioned
// already, or still JSON).
func providedByConfig(ctx caddy.Context) map[string]bool {
	out := map[string]bool{}
	for _, rl := range configRouteLists(ctx) {
		mapDestinations(rl, out)
	}
	return out
}

// configRouteLists returns the route lists of every server of the config
// being loaded's HTTP app: each server's routes, and its error routes.
func configRouteLists(ctx caddy.Context) []caddyhttp.RouteList {
	var lists []caddyhttp.RouteList
	for _, m := range ctx.Modules() {
		app, ok := m.(*caddyhttp.App)
		if !ok {
			continue
		}
		for _, srv := range app.Servers {
			if srv == nil {
				continue
			}
			lists = append(lists, srv.Routes)
			if srv.Errors != nil {
				lists = append(lists, srv.Errors.Routes)
			}
		}
	}
	return lists
}

func mapDestinations(routes caddyhttp.RouteList, out map[string]bool) {
	for _, r := range routes {
		for _, h := range r.Handlers {
			switch v := h.(type) {
			case *maphandler.Handler:
				for _, d := range v.Destinations {
					out[strings.Trim(d, "{}")] = true
				}
			case *caddyhttp.VarsMiddleware:
				for name := range *v {
					out["http.vars."+name] = true
				}
			case *caddyhttp.Subroute:
				mapDestinations(v.Routes, out)
			}
		}
		for _, raw := range r.HandlersRaw {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				rawMapDestinations(v, out)
			}
		}
	}
}

// rawMapDestinations finds map handlers at any depth of a handler's JSON
// (subroutes, handle_response routes, ...).
func rawMapDestinations(v any, out map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		if x["handler"] == "map" {
			ds, _ := x["destinations"].([]any)
			for _, d := range ds {
				if s, ok := d.(string); ok {
					out[strings.Trim(s, "{}")] = true
				}
			}
		}
		if x["handler"] == "vars" {
			for name := range x {
				if name != "handler" {
					out["http.vars."+name] = true
				}
			}
		}
		for _, c := range x {
			rawMapDestinations(c, out)
		}
	case []any:
		for _, c := range x {
			rawMapDestinations(c, out)
		}
	}
}

// discardWriter is the response writer of the request placeholders are
// asked about: it has headers, and writes nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

// emptyKey counts a request whose key resolved to nothing (every
// placeholder empty or unknown at this point): it shares one budget with
// every other such request of the limiter. A line is logged at most once a
// minute, with the template and the placeholders unknown to this request.
func (h *Handler) emptyKey(repl *caddy.Replacer) {
	h.rt.metrics.EmptyKeys.Inc()
	ok, suppressed := h.rt.logs.emptyKey.allow(time.Now())
	if !ok {
		return
	}
	var unknown []string
	for _, name := range templatePlaceholders(h.Key) {
		if _, found := repl.Get(name); !found {
			unknown = append(unknown, "{"+name+"}")
		}
	}
	fields := []zap.Field{zap.String("limiter", h.Name), zap.String("key", h.Key),
		zap.Int64("suppressed_since_last_log", suppressed)}
	if len(unknown) > 0 {
		fields = append(fields, zap.Strings("unknown_placeholders", unknown))
	}
	h.rt.logger.Warn("key resolved to nothing for a request: such requests share one budget of this limiter (counted in empty_keys_total)", fields...)
}
