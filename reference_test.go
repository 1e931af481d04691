package slidingratelimit

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// referenceDoc is where every subdirective, header, placeholder and metric
// is documented.
const referenceDoc = "docs/reference.md"

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReferenceMatchesSyntax: the reference's Caddyfile block is the Syntax
// block of UnmarshalCaddyfile, line for line, and every subdirective the
// parser accepts is in it.
func TestReferenceMatchesSyntax(t *testing.T) {
	doc := readFile(t, referenceDoc)
	ref := regexp.MustCompile("(?s)## Caddyfile reference\n\n```caddyfile\n(.*?)```").FindStringSubmatch(doc)
	if ref == nil {
		t.Fatalf("%s has no '## Caddyfile reference' section opening with a caddyfile block", referenceDoc)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(ref[1], "\n"), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	code := syntaxFromCode(t)
	if strings.Join(lines, "\n") != strings.Join(code, "\n") {
		t.Fatalf("%s's reference and the Syntax comment differ:\n%s:\n%s\n\ncaddyfile.go:\n%s", referenceDoc, referenceDoc, strings.Join(lines, "\n"), strings.Join(code, "\n"))
	}
	syntax := strings.Join(code, "\n")
	for _, sub := range parsedSubdirectives(t) {
		if !regexp.MustCompile(`(?m)^` + sub + `\b`).MatchString(syntax) {
			t.Errorf("subdirective %q is parsed but missing from the Syntax block", sub)
		}
	}
}

// TestReferenceNamesEverything lists, from the code, every subdirective
// the parser accepts, every header the handler writes, every placeholder it
// answers and every metric it registers, and finds each in the reference.
func TestReferenceNamesEverything(t *testing.T) {
	doc := readFile(t, referenceDoc)
	lower := strings.ToLower(doc)
	subs := parsedSubdirectives(t)
	headers := headersFromCode(t)
	phs := placeholdersFromCode(t)
	metrics := metricsFromCode(t)
	// A scan that finds next to nothing is broken, not a pass.
	for what, n := range map[string][2]int{
		"subdirectives": {len(subs), 30}, "headers": {len(headers), 8},
		"placeholders": {len(phs), 20}, "metrics": {len(metrics), 13},
	} {
		if n[0] < n[1] {
			t.Fatalf("found only %d %s in the code, want at least %d: the scan is broken", n[0], what, n[1])
		}
	}
	for _, sub := range subs {
		if !strings.Contains(doc, "`"+sub+"`") && !strings.Contains(doc, "`"+sub+" ") {
			t.Errorf("subdirective %q is parsed (caddyfile.go) but not described in %s", sub, referenceDoc)
		}
	}
	for _, h := range headers {
		// As a header is written in the text: `Retry-After: 1`, `RateLimit`.
		if !regexp.MustCompile("`" + regexp.QuoteMeta(strings.ToLower(h)) + "[`:]").MatchString(lower) {
			t.Errorf("header %s is written by the handler but not described in %s", h, referenceDoc)
		}
	}
	for _, p := range phs {
		if !strings.Contains(doc, "`"+p+"`") {
			t.Errorf("placeholder %s is answered (placeholders.go) but not in %s", p, referenceDoc)
		}
	}
	for _, m := range metrics {
		if !strings.Contains(doc, "`"+m+"`") {
			t.Errorf("metric %s is registered (internal/limitmetrics) but not in %s", m, referenceDoc)
		}
	}
}

// headersFromCode returns the response headers the package's code writes,
// and internal/reply's, which renders its decisions: the hdr* (Hdr*)
// constants, hdr["Name"] assignments and Header().Set/Add calls.
func headersFromCode(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("internal/reply/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, more...)
	pats := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\s*[hH]dr\w+\s*=\s*"([A-Za-z-]+)"`),
		regexp.MustCompile(`\bhdr\["([A-Za-z-]+)"\]\s*=`),
		regexp.MustCompile(`\.Header\(\)\.(?:Set|Add)\("([A-Za-z-]+)"`),
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src := readFile(t, f)
		for _, p := range pats {
			for _, m := range p.FindAllStringSubmatch(src, -1) {
				if !seen[m[1]] {
					seen[m[1]] = true
					out = append(out, m[1])
				}
			}
		}
	}
	return out
}

// funcBody returns the text of the function whose declaration starts with
// decl, up to its closing brace at the start of a line.
func funcBody(t *testing.T, src, decl string) string {
	t.Helper()
	_, rest, ok := strings.Cut(src, decl)
	if !ok {
		t.Fatalf("no %q in the code", decl)
	}
	body, _, _ := strings.Cut(rest, "\n}\n")
	return body
}

// placeholdersFromCode returns every placeholder placeholders.go answers:
// the names of phState.get's cases, and the per-window forms
// (window.<w>.<field>, global.<w>.<field>) with windowValue's fields.
func placeholdersFromCode(t *testing.T) []string {
	t.Helper()
	src := readFile(t, "placeholders.go")
	prefix := regexp.MustCompile(`const phPrefix = "([a-z_.]+)"`).FindStringSubmatch(src)
	if prefix == nil {
		t.Fatal("no phPrefix in placeholders.go")
	}
	cases := regexp.MustCompile(`(?m)^\s*case ((?:"[a-z_]+",?\s*)+):`)
	names := func(body string) []string {
		var out []string
		for _, c := range cases.FindAllStringSubmatch(body, -1) {
			for _, n := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(c[1], -1) {
				out = append(out, n[1])
			}
		}
		return out
	}
	get := funcBody(t, src, "func (s *phState) get(")
	var out []string
	for _, n := range names(get) {
		out = append(out, "{"+prefix[1]+n+"}")
	}
	scopes := regexp.MustCompile(`scope != "([a-z]+)" && scope != "([a-z]+)"`).FindStringSubmatch(get)
	if scopes == nil {
		t.Fatal("phState.get no longer names its window scopes as this test reads them")
	}
	fields := names(funcBody(t, src, "func windowValue("))
	for _, scope := range scopes[1:] {
		for _, f := range dedupe(fields) {
			out = append(out, "{"+prefix[1]+scope+".<w>."+f+"}")
		}
	}
	return out
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// metricsFromCode returns the full name of every metric the handler
// registers (namespace_subsystem_name): the namespace from metrics.go, the
// collectors from internal/limitmetrics, which both front doors count with.
func metricsFromCode(t *testing.T) []string {
	t.Helper()
	ns := regexp.MustCompile(`const metricsNamespace = "([a-z_]+)"`).FindStringSubmatch(readFile(t, "metrics.go"))
	if ns == nil {
		t.Fatal("no `const metricsNamespace = ...` in metrics.go")
	}
	src := readFile(t, "internal/limitmetrics/metrics.go")
	sub := regexp.MustCompile(`const sub = "([a-z_]+)"`).FindStringSubmatch(src)
	if sub == nil {
		t.Fatal("no `const sub = ...` in internal/limitmetrics/metrics.go")
	}
	nsSub := []string{"", ns[1], sub[1]}
	var out []string
	for _, p := range []string{`Namespace: ns, Subsystem: sub, Name: "([a-z_]+)"`, `BuildFQName\(ns, sub, "([a-z_]+)"\)`, `counterVec\(ns, "([a-z_]+)"`} {
		for _, m := range regexp.MustCompile(p).FindAllStringSubmatch(src, -1) {
			out = append(out, nsSub[1]+"_"+nsSub[2]+"_"+m[1])
		}
	}
	return dedupe(out)
}
