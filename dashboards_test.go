package slidingratelimit

// The Grafana dashboard (examples/grafana) and the Prometheus rules
// (examples/prometheus) held to the metrics a running Caddy really exports,
// and the rules to promtool.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

const (
	dashboardFile = "examples/grafana/sliding_ratelimit.json"
	rulesFile     = "examples/prometheus/sliding_ratelimit.rules.yml"
	rulesTestFile = "examples/prometheus/sliding_ratelimit.rules.test.yml"
	operatingDoc  = "docs/operating.md" // describes the dashboard and the rules
)

// targetLabels are the labels Prometheus adds to every series it scrapes:
// the dashboard and rules may use them though /metrics does not show them.
var targetLabels = map[string]bool{"instance": true, "job": true}

// grafanaDashboard is the part of the dashboard JSON the tests read.
type grafanaDashboard struct {
	Title      string         `json:"title"`
	UID        string         `json:"uid"`
	Inputs     []grafanaInput `json:"__inputs"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
}

// grafanaInput is what Grafana asks for when it imports the dashboard.
type grafanaInput struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	PluginID string `json:"pluginId"`
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource *grafanaDatasource `json:"datasource"`
	Targets    []struct {
		RefID      string             `json:"refId"`
		Expr       string             `json:"expr"`
		Datasource *grafanaDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

type grafanaVariable struct {
	Name       string             `json:"name"`
	Type       string             `json:"type"`
	Query      json.RawMessage    `json:"query"` // a string, or {"query": "..."}
	Definition string             `json:"definition"`
	Datasource *grafanaDatasource `json:"datasource"`
	Multi      bool               `json:"multi"`
	IncludeAll bool               `json:"includeAll"`
}

// queryText is a variable's query, in either of Grafana's forms.
func (v grafanaVariable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

func loadDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens the rows' panels.
func allPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// promRule is one rule of the rules file.
type promRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []promRule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string     `yaml:"name"`
			Rules []promRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []promRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s holds no rules", rulesFile)
	}
	return rules
}

// rulesTestSeries returns the input series of the promtool rules test.
func rulesTestSeries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	var out []string
	for _, tt := range f.Tests {
		for _, s := range tt.InputSeries {
			out = append(out, s.Series)
		}
	}
	return out
}

// promqlUse is one PromQL expression and where it was found.
type promqlUse struct {
	where, expr string
	// limiterVar: every selector of a metric with a limiter label must
	// filter by the dashboard's $limiter variable.
	limiterVar bool
}

// labelValuesQuery is Grafana's label_values(<selector>, <label>).
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)

// promqlUses lists every expression of the dashboard, the rules and the
// rules test.
func promqlUses(t *testing.T) []promqlUse {
	t.Helper()
	var uses []promqlUse
	d := loadDashboard(t)
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			uses = append(uses, promqlUse{where: fmt.Sprintf("%s: panel %q, target %s", dashboardFile, p.Title, tg.RefID),
				expr: tg.Expr, limiterVar: true})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("%s: variable %q", dashboardFile, v.Name)
		m := labelValuesQuery.FindStringSubmatch(v.queryText())
		if m == nil {
			t.Errorf("%s: query %q is not label_values(<metric>, <label>)", where, v.queryText())
			continue
		}
		// label_values(metric, label) reads the label as a by() would.
		uses = append(uses, promqlUse{where: where, expr: fmt.Sprintf("group by (%s) (%s)", m[2], m[1])})
	}
	for _, r := range loadRules(t) {
		name := r.Alert + r.Record
		uses = append(uses, promqlUse{where: fmt.Sprintf("%s: rule %q", rulesFile, name), expr: r.Expr})
	}
	for _, s := range rulesTestSeries(t) {
		uses = append(uses, promqlUse{where: fmt.Sprintf("%s: input series", rulesTestFile), expr: s})
	}
	return uses
}

// scrapedMetric is what a scrape shows of one metric family.
type scrapedMetric struct {
	histogram bool
	labels    map[string]map[string]bool // label name → values seen
	values    []scrapedSample
}

type scrapedSample struct {
	labels map[string]string
	value  float64
}

// scrapedMetrics indexes a scrape by family name.
type scrapedMetrics map[string]*scrapedMetric

// scrapeMetrics reads the admin endpoint's /metrics as Prometheus does and
// keeps the series of the given limiters (and those without a limiter
// label): series other tests left in this process do not count.
func scrapeMetrics(t *testing.T, tester *caddytest.Tester, limiters ...string) scrapedMetrics {
	t.Helper()
	resp, err := tester.Client.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	out := scrapedMetrics{}
	for name, f := range fams {
		sm := &scrapedMetric{histogram: f.GetType().String() == "HISTOGRAM", labels: map[string]map[string]bool{}}
		for _, m := range f.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			if lim, ok := ls["limiter"]; ok && !slices.Contains(limiters, lim) {
				continue
			}
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			}
			sm.values = append(sm.values, scrapedSample{ls, v})
			for k, val := range ls {
				if sm.labels[k] == nil {
					sm.labels[k] = map[string]bool{}
				}
				sm.labels[k][val] = true
			}
		}
		if len(sm.values) > 0 {
			out[name] = sm
		}
	}
	return out
}

// series returns the label names and values of a series name as Prometheus
// stores it: a histogram's _bucket (with le), _sum and _count.
func (s scrapedMetrics) series(name string) (map[string]map[string]bool, bool) {
	if m, ok := s[name]; ok && !m.histogram {
		return m.labels, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if m := s[base]; ok && m != nil && m.histogram {
			if suffix != "_bucket" {
				return m.labels, true
			}
			labels := map[string]map[string]bool{"le": {}}
			for k, v := range m.labels {
				labels[k] = v
			}
			return labels, true
		}
	}
	return nil, false
}

// sum adds the samples of a family whose labels include want.
func (s scrapedMetrics) sum(name string, want map[string]string) float64 {
	total := 0.0
	if m := s[name]; m != nil {
		for _, smp := range m.values {
			ok := true
			for k, v := range want {
				ok = ok && smp.labels[k] == v
			}
			if ok {
				total += smp.value
			}
		}
	}
	return total
}

// literalAlternatives matches a regex that is only words separated by |.
var literalAlternatives = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// checkPromQL returns what an expression uses that the scrape does not
// have: metric names, label names, label values (of fixed vocabularies:
// not limiter, datacenter, instance or job, which the operator names, not
// Grafana variables), and grouping labels.
func (s scrapedMetrics) checkPromQL(use promqlUse) []string {
	refs, err := parsePromQL(use.expr)
	if err != nil {
		return []string{fmt.Sprintf("cannot read %q: %v", use.expr, err)}
	}
	var problems []string
	exprLabels := map[string]bool{}
	for _, sel := range refs.Selectors {
		if sel.Metric == "" {
			problems = append(problems, "a selector without a metric name")
			continue
		}
		labels, ok := s.series(sel.Metric)
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is not in the scrape", sel.Metric))
			continue
		}
		for l := range labels {
			exprLabels[l] = true
		}
		filtered := false
		for _, m := range sel.Matchers {
			values, ok := labels[m.Label]
			switch {
			case targetLabels[m.Label]:
				continue
			case !ok:
				problems = append(problems, fmt.Sprintf("metric %s has no label %q (it has %s)", sel.Metric, m.Label, keys(labels)))
				continue
			case m.Label == "limiter":
				filtered = filtered || (m.Op == "=~" && m.Value == "$limiter")
				continue
			case m.Label == "datacenter":
				continue
			case strings.Contains(m.Value, "$"), (m.Op == "=" || m.Op == "!=") && m.Value == "":
				continue
			}
			var want []string
			switch {
			case m.Op == "=" || m.Op == "!=":
				want = []string{m.Value}
			case literalAlternatives.MatchString(m.Value):
				want = strings.Split(m.Value, "|")
			}
			for _, w := range want {
				if !values[w] {
					problems = append(problems, fmt.Sprintf("metric %s has no series with %s=%q (it has %s)", sel.Metric, m.Label, w, keys(values)))
				}
			}
		}
		if use.limiterVar && labels["limiter"] != nil && !filtered {
			problems = append(problems, fmt.Sprintf(`metric %s is not filtered by limiter=~"$limiter"`, sel.Metric))
		}
	}
	for _, g := range refs.Grouping {
		if !exprLabels[g] && !targetLabels[g] && len(problems) == 0 {
			problems = append(problems, fmt.Sprintf("label %q of by/on/... is on none of the metrics the expression reads", g))
		}
	}
	slices.Sort(problems)
	return slices.Compact(problems)
}

func keys[V any](m map[string]V) string {
	if len(m) == 0 {
		return "none"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, strconv.Quote(k))
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// TestDashboardAndRulesUseRealMetrics: a running Caddy serves traffic that
// makes every series the plugin has (allowed, denied, cached denials,
// near-limit crossings, a ban, a queued request, window denials, store
// errors from a Redis killed mid-run, its circuit open, the in-process
// store, a limiter with a global ceiling kept in a ledger); then every
// metric, label and fixed label value used by the
// dashboard's panels and variable, the alert rules and the rules test's
// series must be in the scrape. Each one missing is named.
func TestDashboardAndRulesUseRealMetrics(t *testing.T) {
	mem, queue, rds, glb := uniqueName(), uniqueName(), uniqueName(), uniqueName()
	srv, ledger := redistest.Start(t), redistest.Start(t)
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	route /mem {
		sliding_ratelimit {
			name   `+mem+`
			key    {http.request.header.X-Key}
			limit  4 1m
			ban    1h after 2 within 1m
		}
		respond "ok"
	}
	route /queue {
		sliding_ratelimit {
			name   `+queue+`
			limit  1 1s
			queue  5s
		}
		respond "ok"
	}
	route /redis {
		sliding_ratelimit {
			name   `+rds+`
			key    {http.request.header.X-Key}
			limit  2 1m
			redis  redis://`+srv.Addr()+`
		}
		respond "ok"
	}
	route /global {
		sliding_ratelimit {
			name         `+glb+`
			key          {http.request.header.X-Key}
			region       {http.request.header.X-Region}
			limit        10 1m
			global_limit 20 1m
			global_redis redis://`+ledger.Addr()+`
			datacenter   eu-west
		}
		respond "ok"
	}
}
`, "caddyfile")

	codes := func(path, key string, n int) []int {
		var out []int
		for i := 0; i < n; i++ {
			out = append(out, get(t, tester, "http://localhost:9080"+path, map[string]string{"X-Key": key}).StatusCode)
		}
		return out
	}
	// In-process: 4 admitted (the 4th crosses warn_at), 2 denied (the ban
	// comes with the 2nd), then banned.
	if got, want := codes("/mem", "k", 7), []int{200, 200, 200, 200, 429, 429, 429}; !slices.Equal(got, want) {
		t.Fatalf("/mem statuses %v, want %v", got, want)
	}
	// A queued request: the second waits for the first's second to pass.
	if got := codes("/queue", "", 2); !slices.Equal(got, []int{200, 200}) {
		t.Fatalf("/queue statuses %v, want the second admitted after waiting", got)
	}
	// Redis: 2 admitted, a denial from Redis, then one from the deny cache.
	if got, want := codes("/redis", "a", 4), []int{200, 200, 429, 429}; !slices.Equal(got, want) {
		t.Fatalf("/redis statuses %v, want %v", got, want)
	}
	// The ledger grants eu-west a share of the global ceiling.
	if got := get(t, tester, "http://localhost:9080/global", map[string]string{"X-Key": "g", "X-Region": "eu"}).StatusCode; got != http.StatusOK {
		t.Fatalf("/global status %d, want 200", got)
	}
	// Redis dies: connection errors, fail open, until the circuit opens.
	srv.Kill()
	open := false
	for i := 0; i < 50 && !open; i++ {
		if got := codes("/redis", "b", 1); got[0] != http.StatusOK {
			t.Fatalf("/redis with Redis down: %d, want 200 (fail open)", got[0])
		}
		open = scrapeMetrics(t, tester, rds).sum("caddy_sliding_ratelimit_circuit_state", map[string]string{"limiter": rds}) == 1
	}
	if !open {
		t.Fatal("the circuit did not open with Redis down")
	}

	scraped := scrapeMetrics(t, tester, mem, queue, rds, glb)
	// The traffic did what it was meant to.
	for _, c := range []struct {
		metric string
		labels map[string]string
	}{
		{"caddy_sliding_ratelimit_requests_total", map[string]string{"limiter": mem, "result": "allowed"}},
		{"caddy_sliding_ratelimit_requests_total", map[string]string{"limiter": mem, "result": "denied"}},
		{"caddy_sliding_ratelimit_requests_total", map[string]string{"limiter": rds, "result": "cached_denial"}},
		{"caddy_sliding_ratelimit_requests_total", map[string]string{"limiter": rds, "result": "fail_open"}},
		{"caddy_sliding_ratelimit_near_limit_total", map[string]string{"limiter": mem}},
		{"caddy_sliding_ratelimit_bans_total", map[string]string{"limiter": mem}},
		{"caddy_sliding_ratelimit_window_denials_total", map[string]string{"limiter": mem}},
		{"caddy_sliding_ratelimit_queued_total", map[string]string{"limiter": queue, "result": "allowed"}},
		{"caddy_sliding_ratelimit_queue_wait_seconds", map[string]string{"limiter": queue}},
		{"caddy_sliding_ratelimit_store_errors_total", map[string]string{"limiter": rds, "kind": "connection"}},
		{"caddy_sliding_ratelimit_store_check_duration_seconds", map[string]string{"limiter": rds, "store": "redis"}},
		{"caddy_sliding_ratelimit_store_check_duration_seconds", map[string]string{"limiter": mem, "store": "memory"}},
		{"caddy_sliding_ratelimit_memory_keys", nil},
		{"caddy_sliding_ratelimit_global_grants_total", map[string]string{"limiter": glb, "datacenter": "eu-west"}},
		{"caddy_sliding_ratelimit_ledger_round_trip_seconds", map[string]string{"limiter": glb, "datacenter": "eu-west"}},
	} {
		if got := scraped.sum(c.metric, c.labels); got <= 0 {
			t.Errorf("after the traffic, %s%v = %v, want above 0", c.metric, c.labels, got)
		}
	}

	uses := promqlUses(t)
	for _, use := range uses {
		for _, p := range scraped.checkPromQL(use) {
			t.Errorf("%s: %s\n\t%s", use.where, p, strings.Join(strings.Fields(use.expr), " "))
		}
	}
	if t.Failed() {
		names := make([]string, 0, len(scraped))
		for n := range scraped {
			if strings.HasPrefix(n, "caddy_sliding_ratelimit_") {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		t.Logf("the scrape has: %s", strings.Join(names, ", "))
	}
	t.Logf("%d expressions checked against %d scraped metric families", len(uses), len(scraped))
}

// TestDashboardJSON: the dashboard is valid JSON that Grafana imports: a
// Prometheus data source input and variable, a multi-value `limiter`
// variable fed by label_values of the limiter label, unique panel ids and
// titles, and every panel (rows aside) with a query on the data source
// variable.
func TestDashboardJSON(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	if !slices.ContainsFunc(d.Inputs, func(in grafanaInput) bool { return in.Type == "datasource" && in.PluginID == "prometheus" }) {
		t.Error("__inputs has no Prometheus data source")
	}
	vars := map[string]grafanaVariable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || ds.queryText() != "prometheus" {
		t.Errorf("variable datasource %+v: want a data source variable of type prometheus", ds)
	}
	lim, ok := vars["limiter"]
	switch {
	case !ok:
		t.Fatal("no limiter variable")
	case lim.Type != "query" || !lim.Multi || !lim.IncludeAll:
		t.Errorf("limiter variable: type %q, multi %v, includeAll %v; want a query with several values and All", lim.Type, lim.Multi, lim.IncludeAll)
	case lim.Datasource == nil || lim.Datasource.UID != "${datasource}":
		t.Errorf("limiter variable reads data source %+v, want ${datasource}", lim.Datasource)
	}
	if m := labelValuesQuery.FindStringSubmatch(lim.queryText()); m == nil || m[2] != "limiter" {
		t.Errorf("limiter variable query %q: want label_values(<metric>, limiter)", lim.queryText())
	}

	ids := map[int]string{}
	titles := map[string]bool{}
	panels := 0
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Title == "" || titles[p.Title] {
			t.Errorf("panel %d: title %q empty or not unique", p.ID, p.Title)
		}
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		panels++
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q reads data source %+v, want ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: target %q has no expression or refId", p.Title, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: target %s reads data source %+v", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	if panels == 0 {
		t.Fatal("the dashboard has no panels")
	}
}

// TestRulesShape: every alert waits (for:), has a severity, and says which
// limiter in its summary and description; docs/operating.md describes each
// alert and each dashboard panel.
func TestRulesShape(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Dashboard and alerts\n")
	if !ok {
		t.Fatalf(`%s has no "## Dashboard and alerts" section`, operatingDoc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ") // names may wrap
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if r.For == "" {
			t.Errorf("alert %s has no for:", r.Alert)
		}
		if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" && sev != "info" {
			t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, sev)
		}
		for _, a := range []string{"summary", "description"} {
			if !strings.Contains(r.Annotations[a], "{{ $labels.limiter }}") {
				t.Errorf("alert %s: the %s does not name the limiter: %q", r.Alert, a, r.Annotations[a])
			}
		}
		if strings.Contains(r.Expr, "$") {
			t.Errorf("alert %s: a Grafana variable in a rule: %s", r.Alert, r.Expr)
		}
		if !strings.Contains(section, "`"+r.Alert+"`") {
			t.Errorf("%s's Dashboard and alerts section does not describe alert %s", operatingDoc, r.Alert)
		}
	}
	if len(seen) == 0 {
		t.Fatalf("%s has no alerts", rulesFile)
	}
	for _, p := range allPanels(loadDashboard(t).Panels) {
		if p.Type != "row" && !strings.Contains(section, "**"+p.Title+"**") {
			t.Errorf("%s's Dashboard and alerts section does not describe panel %q (as **%s**)", operatingDoc, p.Title, p.Title)
		}
	}
}

// TestPromtoolRules: promtool accepts the rules, and the rules test shows
// each alert firing on a synthetic series and silent on a normal one.
func TestPromtoolRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found on PATH: install Debian's prometheus package "+
			"(apt-get install --no-install-recommends prometheus; .ci/run does): %v", err)
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
