package slidingratelimit

// Keys that would put every client in one budget: warned about when the
// config loads, counted and logged when a request's key resolves to
// nothing.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// loadWarnings loads a config (JSON, or a Caddyfile adapted first) as
// Caddy does, with this module's log at WARN written to a file, and
// returns the lines logged.
func loadWarnings(t *testing.T, src, adapter string) []map[string]any {
	t.Helper()
	raw := []byte(src)
	if adapter == "caddyfile" {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		raw = out
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "warnings.log")
	cfg["logging"] = map[string]any{"logs": map[string]any{"sliding": map[string]any{
		"writer":  map[string]any{"output": "file", "filename": logFile, "roll": false},
		"encoder": map[string]any{"format": "json"},
		"level":   "WARN",
		"include": []string{"http.handlers.sliding_ratelimit"},
	}}}
	raw, _ = json.Marshal(cfg)
	var cc caddy.Config
	if err := json.Unmarshal(raw, &cc); err != nil {
		t.Fatal(err)
	}
	if err := validateConfig(&cc); err != nil {
		t.Fatalf("the config does not load: %v", err)
	}
	f, err := os.Open(logFile)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// TestKeyWarningsAtLoad: a key that would put every client in one budget
// (no placeholder, a typo in a placeholder, a Caddyfile shorthand in JSON)
// loads with one warning per limiter that names the limiter and the
// template, and the placeholder it meant when one is close. Keys Caddy or
// the config provides, in either form, load without a word.
func TestKeyWarningsAtLoad(t *testing.T) {
	t.Parallel()
	caddyfile := func(name, lines string) string {
		return ":8080 {\n\tsliding_ratelimit {\n\t\tname " + name + "\n\t\t" + strings.ReplaceAll(lines, "\n", "\n\t\t") +
			"\n\t\tlimit 5\n\t\twindow 1m\n\t}\n\trespond ok\n}\n"
	}
	jsonCfg := func(name, key string) string {
		return `{"apps":{"http":{"servers":{"s":{"listen":[":8080"],"routes":[{"handle":[
			{"handler":"sliding_ratelimit","name":"` + name + `","key":"` + key + `","limit":5,"window":"1m"}]}]}}}}}`
	}
	type warning struct{ msg, field, template, placeholder, suggestion string }
	noPlaceholder := "key has no placeholder that differs per request: every client shares one budget"
	unknown := "placeholder is not one that Caddy or a handler of this config provides"
	for _, c := range []struct {
		name, src, adapter string
		want               []warning
	}{
		{"key without braces", caddyfile("nobraces", "key client_ip"), "caddyfile",
			[]warning{{noPlaceholder, "key", "client_ip", "", "{client_ip} in a Caddyfile"}}},
		{"key of an environment variable", caddyfile("envkey", "key {env.TENANT}"), "caddyfile",
			[]warning{{noPlaceholder, "key", "{env.TENANT}", "", "{client_ip} in a Caddyfile"}}},
		{"typo in the header family", caddyfile("heder", "key {http.request.heder.X-API-Key}"), "caddyfile",
			[]warning{{"key " + unknown, "key", "{http.request.heder.X-API-Key}", "{http.request.heder.X-API-Key}", "{http.request.header.X-API-Key}"}}},
		{"typo in a name", caddyfile("remotehost", "key {http.request.remote.hots}"), "caddyfile",
			[]warning{{"key " + unknown, "key", "{http.request.remote.hots}", "{http.request.remote.hots}", "{http.request.remote.host}"}}},
		{"typo inside a longer template", caddyfile("tenant", "key tenant-{http.request.cokie.session}"), "caddyfile",
			[]warning{{"key " + unknown, "key", "tenant-{http.request.cokie.session}", "{http.request.cokie.session}", "{http.request.cookie.session}"}}},
		{"a name nothing sets", caddyfile("tier", "key {tier}"), "caddyfile",
			[]warning{{"key " + unknown, "key", "{tier}", "{tier}", ""}}},
		{"typo in the region", caddyfile("region", "key {client_ip}\nregion {http.request.headers.X-Region}"), "caddyfile",
			[]warning{{"region " + unknown, "region", "{http.request.headers.X-Region}", "{http.request.headers.X-Region}", "{http.request.header.X-Region}"}}},
		{"shorthand in JSON", jsonCfg("jsonshort", "{client_ip}"), "json",
			[]warning{{"key " + unknown, "key", "{client_ip}", "{client_ip}", "{http.vars.client_ip}"}}},
		{"header shorthand in JSON", jsonCfg("jsonheader", "{header.X-API-Key}"), "json",
			[]warning{{"key " + unknown, "key", "{header.X-API-Key}", "{header.X-API-Key}", "{http.request.header.X-API-Key}"}}},
		{"remote_host shorthand in JSON", jsonCfg("jsonremote", "{remote_host}"), "json",
			[]warning{{"key " + unknown, "key", "{remote_host}", "{remote_host}", "{http.request.remote.host}"}}},

		// What Caddy or the config provides, in both forms.
		{"client_ip shorthand", caddyfile("ok1", "key {client_ip}"), "caddyfile", nil},
		{"remote_host shorthand", caddyfile("ok2", "key {remote_host}"), "caddyfile", nil},
		{"header shorthand", caddyfile("ok3", "key {header.X-API-Key}\nregion {header.X-Region}"), "caddyfile", nil},
		{"query and cookie shorthands", caddyfile("ok4", "key {query.token}-{cookie.session}"), "caddyfile", nil},
		{"long forms", caddyfile("ok5", "key {http.request.header.X-API-Key}|{http.vars.client_ip}|{http.request.uri.query.token}|{http.request.cookie.s}"), "caddyfile", nil},
		{"TLS client certificate", caddyfile("ok6", "key {http.request.tls.client.fingerprint}"), "caddyfile", nil},
		{"authenticated user", caddyfile("ok7", "key {http.auth.user.id}"), "caddyfile", nil},
		{"regexp capture", caddyfile("ok8", "key {re.tenant.1}"), "caddyfile", nil},
		{"default key", caddyfile("ok9", ""), "caddyfile", nil},
		{"long forms in JSON", jsonCfg("ok10", "{http.vars.client_ip}"), "json", nil},
		{"a map's destination", ":8080 {\n\tmap {header.X-API-Key} {tier} {\n\t\tdefault free\n\t}\n\troute {\n\t\tsliding_ratelimit {\n\t\t\tname ok11\n\t\t\tkey {tier}-{client_ip}\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t\trespond ok\n\t}\n}\n", "caddyfile", nil},
		{"a map's destination in a later route", ":8080 {\n\troute /a {\n\t\tsliding_ratelimit {\n\t\t\tname ok12\n\t\t\tkey {plan}\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\troute /b {\n\t\tmap {header.X-API-Key} {plan} {\n\t\t\tdefault free\n\t\t}\n\t}\n\trespond ok\n}\n", "caddyfile", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var got []warning
			for _, l := range loadWarnings(t, c.src, c.adapter) {
				if l["level"] != "warn" {
					continue
				}
				w := warning{msg: l["msg"].(string)}
				for _, f := range []string{"key", "region"} {
					if v, ok := l[f].(string); ok {
						w.field, w.template = f, v
					}
				}
				w.placeholder, _ = l["placeholder"].(string)
				w.suggestion, _ = l["did_you_mean"].(string)
				if l["limiter"] == nil {
					t.Errorf("warning %v does not name the limiter", l)
				}
				got = append(got, w)
			}
			if len(got) != len(c.want) {
				t.Fatalf("warnings %+v, want %+v", got, c.want)
			}
			for i, w := range c.want {
				g := got[i]
				if !strings.HasPrefix(g.msg, w.msg) || g.field != w.field || g.template != w.template ||
					g.placeholder != w.placeholder || !strings.HasPrefix(g.suggestion, w.suggestion) || (w.suggestion == "") != (g.suggestion == "") {
					t.Errorf("warning %+v, want %+v", g, w)
				}
			}
		})
	}
}

// TestKeyWarningOncePerLimiter: one limiter in two routes, or one block
// in a site of two addresses (a handler in two servers), is warned about
// once; the config loads.
func TestKeyWarningOncePerLimiter(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		":8080 {\n\troute /a {\n\t\tsliding_ratelimit {\n\t\t\tname twice\n\t\t\tkey everyone\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\troute /b {\n\t\tsliding_ratelimit {\n\t\t\tname twice\n\t\t\tkey everyone\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond ok\n}\n",
		":8080, :8081 {\n\tsliding_ratelimit {\n\t\tkey everyone\n\t\tlimit 5\n\t\twindow 1m\n\t}\n\trespond ok\n}\n",
	} {
		n := 0
		for _, l := range loadWarnings(t, src, "caddyfile") {
			if l["key"] == "everyone" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d warnings about the key, want 1, for\n%s", n, src)
		}
	}
}

// TestSuggestPlaceholder: near misses get the placeholder they meant;
// names far from any get none.
func TestSuggestPlaceholder(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http.request.heder.X-API-Key":   "{http.request.header.X-API-Key}",
		"http.reqest.header.X-API-Key":   "{http.request.header.X-API-Key}",
		"http.request.header.":           "",
		"http.request.uri.qeury.token":   "{http.request.uri.query.token}",
		"http.var.client_ip":             "{http.vars.client_ip}",
		"http.vars.clientip":             "{http.vars.clientip}", // a var may have any name: the family is right
		"client_ip":                      "{http.vars.client_ip}",
		"cookie.session":                 "{http.request.cookie.session}",
		"http.request.remote_host":       "{http.request.remote.host}",
		"tier":                           "",
		"something.entirely.else":        "",
		"http.request.tsl.client.issuer": "{http.request.tls.client.issuer}",
	} {
		if got := suggestPlaceholder(in); got != want {
			t.Errorf("suggestPlaceholder(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEmptyKeysShareOneBudget: requests whose key resolves to nothing (the
// header is missing, or the placeholder is unknown) are limited together in
// one bucket of the limiter, never unlimited; each is counted in
// empty_keys_total, and one line a minute is logged with the template.
// Requests with a key, and a key deliberately the same for everyone, are
// not counted.
func TestEmptyKeysShareOneBudget(t *testing.T) {
	t.Setenv("SLIDING_RATELIMIT_TEST_TENANT", "acme")
	for _, c := range []struct {
		name, key  string
		hdr        map[string]string // the requests' headers
		counted    bool
		unknownPhs []string
	}{
		{"header missing", "{http.request.header.X-API-Key}", nil, true, nil},
		{"header empty", "{http.request.header.X-API-Key}", map[string]string{"X-API-Key": ""}, true, nil},
		{"placeholder unknown", "{http.request.heder.X-API-Key}", map[string]string{"X-API-Key": "k1"}, true, []string{"{http.request.heder.X-API-Key}"}},
		{"every placeholder of a template empty", "tenant-{http.request.header.X-Tenant}:{http.request.header.X-API-Key}", nil, true, nil},
		{"an environment variable and an empty header", "{env.SLIDING_RATELIMIT_TEST_TENANT}-{http.request.header.X-API-Key}", nil, true, nil},
		{"one placeholder of two set", "tenant-{http.request.header.X-Tenant}:{http.request.header.X-API-Key}", map[string]string{"X-API-Key": "k1"}, false, nil},
		{"a key", "{http.request.header.X-API-Key}", map[string]string{"X-API-Key": "k1"}, false, nil},
		{"one budget for the site", "everyone", nil, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := &Handler{Name: uniqueName(), Key: c.key, Limit: "3", Window: caddy.Duration(time.Minute)}
			core, logs := observer.New(zapcore.WarnLevel)
			h.rt = &provisioned{logger: zap.New(core)}
			provision(t, h, newTestClock())
			h.rt.logger = zap.New(core)
			logs.TakeAll() // the load's own warnings
			var codes []int
			for i := 0; i < 5; i++ {
				codes = append(codes, serve(t, h, c.hdr).Code)
			}
			// One bucket: 3 admitted, then 429: never unlimited.
			want := []int{200, 200, 200, 429, 429}
			for i := range want {
				if codes[i] != want[i] {
					t.Fatalf("statuses %v, want %v", codes, want)
				}
			}
			wantCount := 0.0
			if c.counted {
				wantCount = 5
			}
			if got := testutil.ToFloat64(h.rt.metrics.EmptyKeys); got != wantCount {
				t.Errorf("empty_keys_total = %v, want %v", got, wantCount)
			}
			lines := logs.FilterMessageSnippet("key resolved to nothing").All()
			if !c.counted {
				if len(lines) != 0 {
					t.Errorf("logged %v for requests with a key", lines)
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines about empty keys for 5 requests, want 1 a minute:\n%s", len(lines), renderLogs(logs))
			}
			f := lines[0].ContextMap()
			if f["key"] != c.key || f["limiter"] != h.Name {
				t.Errorf("log line %v does not name the limiter and the template %q", f, c.key)
			}
			got, _ := f["unknown_placeholders"].([]any)
			if len(got) != len(c.unknownPhs) || len(got) == 1 && got[0] != c.unknownPhs[0] {
				t.Errorf("unknown_placeholders %v, want %v", got, c.unknownPhs)
			}
		})
	}
}

// TestEmptyKeysMetricScraped: empty_keys_total is on Caddy's /metrics from
// the limiter's start, at zero, and counts what the handler counted.
func TestEmptyKeysMetricScraped(t *testing.T) {
	name := uniqueName()
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	sliding_ratelimit {
		name `+name+`
		key  {header.X-API-Key}
		limit 100
		window 1m
	}
	respond "ok"
}
`, "caddyfile")
	if got := scrape(t, tester, "caddy_sliding_ratelimit_empty_keys_total", `limiter="`+name+`"`); got != 0 {
		t.Fatalf("empty_keys_total before any request = %v, want 0", got)
	}
	for i := 0; i < 2; i++ {
		resp := get(t, tester, "http://localhost:9080/", nil) // no X-API-Key
		resp.Body.Close()
	}
	resp := get(t, tester, "http://localhost:9080/", map[string]string{"X-API-Key": "k"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request with a key: %d", resp.StatusCode)
	}
	if got := scrape(t, tester, "caddy_sliding_ratelimit_empty_keys_total", `limiter="`+name+`"`); got != 2 {
		t.Fatalf("empty_keys_total = %v after 2 requests without a key, want 2", got)
	}
}

// TestAmountPlaceholdersCheckedAtLoad: a placeholder in limit,
// global_limit, cost or max_concurrent that nothing provides resolves to
// nothing, and every request would be answered 500: the config is refused
// at load, naming the limiter, the directive, the placeholder, when one is
// close the one it meant (Caddy's, or a map destination or var of this
// config), and the Caddyfile line. Placeholders Caddy or the config provides
// (request headers, a map's destination, vars, the environment) load.
func TestAmountPlaceholdersCheckedAtLoad(t *testing.T) {
	t.Parallel()
	site := func(name, lines string) string {
		return ":8080 {\n\tmap {header.X-API-Key} {tier_limit} {\n\t\tdefault 5\n\t}\n\tsliding_ratelimit {\n\t\tname " + name +
			"\n\t\tkey {header.X-API-Key}\n\t\t" + strings.ReplaceAll(lines, "\n", "\n\t\t") + "\n\t}\n\trespond ok\n}\n"
	}
	unknown := "is not one that Caddy or a handler of this config provides: it resolves to nothing, and every request would be answered 500"
	for i, c := range []struct {
		name, lines, want string
	}{
		{"typo in limit", "limit {http.request.heder.X-Tier}\nwindow 1m",
			"limiter amt0: limit {http.request.heder.X-Tier}: placeholder {http.request.heder.X-Tier} " + unknown + " (did you mean {http.request.header.X-Tier}?), at Caddyfile:8"},
		{"typo in a map's destination", "limit {tier_limt}\nwindow 1m",
			"limiter amt1: limit {tier_limt}: placeholder {tier_limt} " + unknown + " (did you mean {tier_limit}?), at Caddyfile:8"},
		{"typo in a second window", "limit 100 1m\nlimit {tire} 1h",
			"limiter amt2: limits[1]: limit {tire}: placeholder {tire} " + unknown + ", at Caddyfile:9"},
		{"typo in global_limit", "region {header.X-Region}\nlimit 5 1m\nglobal_limit {http.request.uri.qurey.g} 1m",
			"limiter amt3: global_limits[0]: global_limit {http.request.uri.qurey.g}: placeholder {http.request.uri.qurey.g} " + unknown + " (did you mean {http.request.uri.query.g}?), at Caddyfile:10"},
		{"typo in cost", "limit 5\nwindow 1m\ncost {http.request.header.X-Cost}{costs}",
			"limiter amt4: cost {http.request.header.X-Cost}{costs}: placeholder {costs} " + unknown + ", at Caddyfile:10"},
		{"typo in max_concurrent", "limit 5\nwindow 1m\nmax_concurrent {http.reqest.header.X-Max}",
			"limiter amt5: max_concurrent {http.reqest.header.X-Max}: placeholder {http.reqest.header.X-Max} " + unknown + " (did you mean {http.request.header.X-Max}?), at Caddyfile:10"},
		{"a var written bare", "vars_tier\nlimit {tier_gold}\nwindow 1m",
			"limiter amt6: limit {tier_gold}: placeholder {tier_gold} " + unknown + " (did you mean {http.vars.tier_gold}?), at Caddyfile:8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := site(fmt.Sprintf("amt%d", i), c.lines)
			if rest, ok := strings.CutPrefix(c.lines, "vars_tier\n"); ok {
				src = strings.Replace(site(fmt.Sprintf("amt%d", i), rest), "\trespond ok", "\tvars tier_gold 10\n\trespond ok", 1)
			}
			err := loadCaddyfile(t, src)
			if err == nil || !strings.HasSuffix(err.Error(), c.want) {
				t.Errorf("loading gives %v, want %q", err, c.want)
			}
		})
	}
	for _, lines := range []string{
		"limit {header.X-Tier}\nwindow 1m\ncost {header.X-Cost}\nmax_concurrent {header.X-Max}",
		"limit {tier_limit}\nwindow 1m",
		"limit {vars.tier}\nwindow 1m\ncost {http.vars.cost}",
		"limit {env.SLIDING_RATELIMIT_LIMIT}\nwindow 1m",
		"region {header.X-Region}\nlimit 5 1m\nglobal_limit {query.g} 1m",
		"limit 5\nwindow 1m\nmax_concurrent {re.tier.1}",
	} {
		if err := loadCaddyfile(t, site("ok", lines)); err != nil {
			t.Errorf("refused at load:\n%s\n%v", lines, err)
		}
	}
}

// loadCaddyfile adapts a Caddyfile and loads it as Caddy does (provisioned
// and validated, nothing started).
func loadCaddyfile(t *testing.T, src string) error {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return validateConfig(&cfg)
}
