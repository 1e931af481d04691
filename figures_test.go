package slidingratelimit

// The figures the README and docs/ quote, held to the recorded output of
// the command that measured them: the benchmark's run in docs/bench.md and
// the accuracy run in docs/accuracy.txt. (The first-hour times are held to
// docs/first-hour.txt by TestReadmeTimesMeasured.)

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// benchRecord is what the run quoted in the README printed.
type benchRecord struct {
	header  string                         // the Machine: line
	pairs   string                         // the Each site: line
	sites   map[string]map[string][]string // layout -> site -> cells
	columns map[string]int                 // column name -> index
	trivial map[string]string              // layout -> µs of a trivial EVAL
	p99     map[string]string              // layout -> p99 added at half load
	cached  map[string]string              // layout -> hot_denied's calls per denied request
	allocs  map[string]string              // micro-benchmark -> allocs/op
}

// mdCells splits a Markdown table row into trimmed cells without the
// emphasis marks.
func mdCells(row string) []string {
	row = strings.Trim(strings.TrimSpace(row), "|")
	var out []string
	for _, c := range strings.Split(row, "|") {
		out = append(out, strings.TrimSpace(strings.ReplaceAll(c, "**", "")))
	}
	return out
}

// readBenchRecord parses docs/bench.md's "## The run in this README".
func readBenchRecord(t *testing.T) benchRecord {
	t.Helper()
	_, run, ok := strings.Cut(readFile(t, "docs/bench.md"), "\n## The run in this README\n")
	if !ok {
		t.Fatal("docs/bench.md has no '## The run in this README' section")
	}
	r := benchRecord{sites: map[string]map[string][]string{}, columns: map[string]int{},
		trivial: map[string]string{}, p99: map[string]string{}, cached: map[string]string{}, allocs: map[string]string{}}
	layout := ""
	for _, l := range strings.Split(run, "\n") {
		switch {
		case strings.HasPrefix(l, "Machine: "):
			r.header = l
		case strings.HasPrefix(l, "Each site: "):
			r.pairs = l
		case strings.HasPrefix(l, "#### Layout "):
			layout = strings.TrimSuffix(strings.Fields(l)[2], ":")
			r.sites[layout] = map[string][]string{}
		case strings.HasPrefix(l, "#### "):
			layout = ""
		case layout != "" && strings.HasPrefix(l, "Trivial-script baseline"):
			if m := regexp.MustCompile(`costs ([\d.]+) µs per call`).FindStringSubmatch(l); m != nil {
				r.trivial[layout] = m[1]
			}
		case layout != "" && strings.HasPrefix(l, "- p99 added by redis_log: "):
			r.p99[layout] = regexp.MustCompile(`\*\*([^*]+)\*\*`).FindStringSubmatch(l)[1]
		case layout != "" && strings.HasPrefix(l, "- hot_denied: "):
			r.cached[layout] = regexp.MustCompile(`\*\*([\d.]+) per denied request`).FindStringSubmatch(l)[1]
		case strings.HasPrefix(l, "| "):
			c := mdCells(l)
			switch {
			case c[0] == "site":
				for i, name := range c {
					r.columns[name] = i
				}
			case layout != "" && !strings.HasPrefix(c[0], "---"):
				r.sites[layout][c[0]] = c
			case strings.HasPrefix(c[0], "BenchmarkHandler/"):
				r.allocs[strings.TrimPrefix(c[0], "BenchmarkHandler/")] = c[len(c)-1]
			}
		}
	}
	if r.header == "" || len(r.sites["pinned"]) < 9 || len(r.sites["shared"]) < 9 || len(r.allocs) < 5 {
		t.Fatalf("docs/bench.md's run did not parse: header %q, %d pinned and %d shared sites, %d micro-benchmarks", r.header, len(r.sites["pinned"]), len(r.sites["shared"]), len(r.allocs))
	}
	return r
}

// cell is one figure of the record; the test fails on a site or column it
// does not have.
func (r benchRecord) cell(t *testing.T, layout, site, column string) string {
	t.Helper()
	i, ok := r.columns[column]
	row, ok2 := r.sites[layout][site]
	if !ok || !ok2 || i >= len(row) {
		t.Fatalf("docs/bench.md's run has no %q for site %s in layout %s", column, site, layout)
	}
	return strings.TrimSuffix(row[i], "×")
}

// num reads a figure as a number.
func num(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(strings.TrimPrefix(s, "+"), 64)
	if err != nil {
		t.Fatalf("figure %q is not a number", s)
	}
	return v
}

// round formats v with d decimals, as the README writes it.
func round(v float64, d int) string { return strconv.FormatFloat(v, 'f', d, 64) }

// firstNum is the first number of a cell: "**0.81** (0.78–0.83)" -> 0.81.
func firstNum(t *testing.T, s string) float64 {
	t.Helper()
	m := regexp.MustCompile(`[\d.]+`).FindString(s)
	if m == "" {
		t.Fatalf("cell %q has no number", s)
	}
	return num(t, m)
}

// vsBare is the limiter's share of a "Caddy CPU µs/req (vs bare)" cell:
// "27.7 (+9.3)" -> "9.3"; bare is the first number.
func vsBare(s string) (total, added string) {
	m := regexp.MustCompile(`^([\d.]+) \(\+?([-\d.]+)\)$`).FindStringSubmatch(s)
	if m == nil {
		return s, ""
	}
	return m[1], m[2]
}

// TestFiguresBench: every figure of the README's benchmark tables, and the
// run it names, is the one docs/bench.md records: each ratio cell is the
// recorded one of its site and layout, and each cost row is worked out from
// the record the way its label says.
func TestFiguresBench(t *testing.T) {
	r := readBenchRecord(t)
	sec := readmeSection(t, "Benchmarks")
	ratios, costs := 0, 0
	const ratio = "ratio to bare"
	script, calls, cpu, times := "script µs/req", "Redis calls/req", "Caddy CPU µs/req (vs bare)", "× trivial"
	rules := map[string]func() string{
		"Caddy CPU added per request, pinned": func() string {
			_, a := vsBare(r.cell(t, "pinned", "memory_log", cpu))
			_, b := vsBare(r.cell(t, "pinned", "redis_log", cpu))
			_, c := vsBare(r.cell(t, "pinned", "hot_denied", cpu))
			bare, _ := vsBare(r.cell(t, "pinned", "none", cpu))
			return fmt.Sprintf("%s / %s / %s µs (bare Caddy: %s µs)", a, b, c, bare)
		},
		"Redis script time per `sliding_log` check": func() string {
			return fmt.Sprintf("%s µs, %sx a trivial `EVAL` (%s µs)", round(num(t, r.cell(t, "pinned", "redis_log_100", script)), 1),
				round(num(t, r.cell(t, "pinned", "redis_log_100", times)), 0), r.trivial["pinned"])
		},
		"Redis script time per `sliding_counter` / `fixed_window` / `token_bucket` check": func() string {
			var us []string
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, s := range []string{"redis_counter", "redis_fixed", "redis_token"} {
				us = append(us, round(num(t, r.cell(t, "pinned", s, script)), 1))
				x := math.Round(num(t, r.cell(t, "pinned", s, times)))
				lo, hi = math.Min(lo, x), math.Max(hi, x)
			}
			return fmt.Sprintf("%s µs, %s–%sx", strings.Join(us, " / "), round(lo, 0), round(hi, 0))
		},
		"Redis calls per request": func() string {
			c := num(t, r.cell(t, "pinned", "redis_log", calls))
			return fmt.Sprintf("%s (about %s checks per `EVALSHA`); cached denials %s", round(c, 2), round(1/c, 0), r.cached["pinned"])
		},
		"allocations per admitted request over the harness, in process / Redis": func() string {
			m, rd, base := r.allocs["memory/sliding_log/admitted"], r.allocs["redis/sliding_log/admitted"], r.allocs["baseline"]
			return fmt.Sprintf("+%s / +%s (harness %s)", round(num(t, m)-num(t, base), 0), round(num(t, rd)-num(t, base), 0), base)
		},
		"Redis CPU per `sliding_log` check, FCALL (Redis 7) / EVALSHA (Redis 5, 6)": func() string {
			cpu := "Redis CPU µs/req"
			return fmt.Sprintf("%s / %s µs", r.cell(t, "pinned", "redis_log", cpu), r.cell(t, "pinned", "redis_log_eval", cpu))
		},
		"in process, ahead of the peer (pinned, same run)": func() string {
			ours, peer := firstNum(t, r.cell(t, "pinned", "memory_log", ratio)), firstNum(t, r.cell(t, "pinned", "peer_memory", ratio))
			return fmt.Sprintf("%+.2f (%s vs %s)", ours-peer, round(ours, 2), round(peer, 2))
		},
		"p99 added by Redis `sliding_log` at half of its max load, pinned": func() string { return r.p99["pinned"] },
		"Envoy RLS, 12-02: `cmd/rls` ÷ envoyproxy/ratelimit":               func() string { return rlsFigure(t) },
		"Redis instructions per check, FCALL 16 a call (callgrind, 12-06)": func() string { return instructionsFigure(t) },
	}
	used := map[string]bool{}
	for _, l := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(l, "| ") {
			continue
		}
		c := mdCells(l)
		if c[0] == "site" || c[0] == "cost" || strings.HasPrefix(c[0], "---") {
			continue
		}
		if site := strings.Trim(c[0], "`"); site != c[0] { // the ratio table
			ratios++
			for layout, col := range map[string]int{"pinned": 2, "shared": 4} {
				if want := r.cell(t, layout, site, ratio); c[col] != want {
					t.Errorf("README, Benchmarks: %s %s is %q, the record (docs/bench.md) says %q", site, layout, c[col], want)
				}
			}
			continue
		}
		costs++
		found := false
		for label, rule := range rules {
			if strings.HasPrefix(c[0], label) {
				found, used[label] = true, true
				if want := rule(); c[1] != want {
					t.Errorf("README, Benchmarks: %q is %q; from the record (docs/bench.md) it is %q", c[0], c[1], want)
				}
			}
		}
		if !found {
			t.Errorf("README, Benchmarks: row %q has no rule tying it to docs/bench.md's record: add one here", c[0])
		}
	}
	if ratios < 9 || costs < len(rules) {
		t.Fatalf("README, Benchmarks: %d ratio rows and %d cost rows, want at least 9 and %d", ratios, costs, len(rules))
	}
	// The run the README names is the recorded one.
	if m := regexp.MustCompile(`(\d+) pairs of (\d+) s per site`).FindStringSubmatch(sec); m == nil || !strings.Contains(r.pairs, m[1]+" pairs of a "+m[2]+"s site run") {
		t.Errorf("README, Benchmarks: the pairs it names (%v) are not the record's: %s", m, r.pairs)
	}
	for _, p := range []string{`\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC`, `redis-server \d+(\.\d+)*`} {
		m := regexp.MustCompile(p).FindString(sec)
		if m == "" || !strings.Contains(r.header, m) {
			t.Errorf("README, Benchmarks: %q is not in the record's %q", m, r.header)
		}
	}
}

// accuracyRecord is the output of `go run ./cmd/accuracy` (make accuracy).
const accuracyRecord = "docs/accuracy.txt"

// TestFiguresAccuracy: every share of requests decided differently that the
// README or docs/ state is the recorded run's, rounded as written.
func TestFiguresAccuracy(t *testing.T) {
	m := regexp.MustCompile(`(?m)^decided differently: \d+ of \d+ = ([\d.]+)%$`).FindStringSubmatch(readFile(t, accuracyRecord))
	if m == nil {
		t.Fatalf("%s has no 'decided differently: n of m = x%%' line", accuracyRecord)
	}
	recorded := num(t, m[1])
	claim := regexp.MustCompile(`(\d+\.(\d+))% of (?:a bursty trace|requests|the trace's requests) decided differently`)
	claims := 0
	for _, doc := range docFiles(t) {
		for _, c := range claim.FindAllStringSubmatch(withoutFences(readFile(t, doc)), -1) {
			claims++
			if want := round(recorded, len(c[2])); c[1] != want {
				t.Errorf("%s states %s%% decided differently; the record %s says %s%% (%s%% as written)", doc, c[1], accuracyRecord, m[1], want)
			}
		}
	}
	if claims < 2 {
		t.Fatalf("found %d statements of the share decided differently in the README and docs/, want the reference's and testing.md's", claims)
	}
}

// multidcRecord is the last run of make multidc, which the README quotes.
const multidcRecord = "docs/multidc.txt"

// TestFiguresMultidc: the README's figures of the data-centre run are the
// record's.
func TestFiguresMultidc(t *testing.T) {
	rec := readFile(t, multidcRecord)
	readme := readFile(t, "README.md")
	for _, f := range []struct{ readme, record string }{
		{`(\d+) cells over the ceiling`, `over-admission: (\d+) cells over the ceiling`},
		{`the least median\s+window\s+used\s+([\d.]+) %`, `median window >= \d+ % \(or within the slack\): \d+ of \d+ cells; the least median ([\d.]+) %`},
		{`the least worst\s+window\s+([\d.]+) %`, `worst window >= \d+ % \(or within the slack\): \d+ of \d+ cells; the least ([\d.]+) %`},
		{`met\s+in\s+(\d+)\s+and`, `median window >= \d+ % \(or within the slack\): (\d+) of`},
		{`and\s+(\d+)\s+of\s+\d+\s+cells\)`, `worst window >= \d+ % \(or within the slack\): (\d+) of`},
		{`of\s+(\d+)\s+cells\)`, `Summary over (\d+) cells`},
		{`at\s+least\s+([\d.]+) %\s+of\s+its\s+ask`, `fairness, a flat data centre >= \d+ % of what it asked: \d+ of \d+ cells; the least ([\d.]+) %`},
		{`recovery\s+at\s+most\s+([\d.]+) s`, `the slowest ([\d.]+) s`},
		{`p99\s+added\s+at\s+most\s+(-?[\d.]+) ms`, `p99 added, the most of any cell: (-?[\d.]+) ms`},
	} {
		got := regexp.MustCompile(f.readme).FindStringSubmatch(readme)
		want := regexp.MustCompile(f.record).FindStringSubmatch(rec)
		if got == nil || want == nil {
			t.Errorf("%q in README.md: %v; %q in %s: %v", f.readme, got, f.record, multidcRecord, want)
			continue
		}
		if got[1] != want[1] {
			t.Errorf("README.md says %s where %s says %s (%s)", got[1], multidcRecord, want[1], f.readme)
		}
	}
}
