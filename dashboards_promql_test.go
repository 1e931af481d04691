package slidingratelimit

// A small PromQL reader for the tests that hold the Grafana dashboard and
// the Prometheus rules to the metrics the plugin exports. It does not
// evaluate anything: it lexes an expression the way Prometheus does
// (strings, numbers and durations, comments, Grafana's $variables) and
// finds what the expression refers to: the vector selectors (metric name
// and label matchers) and the labels of by / without / on / ignoring /
// group_left / group_right. Function and aggregation names are known, so a
// misspelled function is an error rather than a metric. (The PromQL parser
// lives in github.com/prometheus/prometheus, which this module does not
// depend on.)

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// promqlSelector is one vector selector: `metric{label="value", ...}`.
type promqlSelector struct {
	Metric   string
	Matchers []promqlMatcher
}

// promqlMatcher is one label matcher inside braces.
type promqlMatcher struct {
	Label, Op, Value string
}

// promqlRefs is what an expression refers to.
type promqlRefs struct {
	Selectors []promqlSelector
	Grouping  []string // label names of by, without, on, ignoring, group_left, group_right
}

// promqlAggregations are PromQL's aggregation operators: followed by a
// parenthesized argument list, and by / without before or after it.
var promqlAggregations = wordSet("sum avg count min max group stddev stdvar topk bottomk quantile count_values limitk limit_ratio")

// promqlFunctions are PromQL's functions (Prometheus 2 and 3), and start()
// and end() of the @ modifier.
var promqlFunctions = wordSet(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
	clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta
	deriv double_exponential_smoothing end exp floor histogram_avg histogram_count histogram_fraction
	histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase info irate
	label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
	predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort
	sort_by_label sort_by_label_desc sort_desc sqrt start stddev_over_time stdvar_over_time sum_over_time tan
	tanh time timestamp vector year`)

// promqlGroupings take a parenthesized list of label names (optional for
// group_left and group_right).
var promqlGroupings = wordSet("by without on ignoring group_left group_right")

// promqlKeywords are the other words that are never metric names in
// expression position: set operators, atan2, bool, offset, and the number
// literals Inf and NaN (any case).
var promqlKeywords = wordSet("and or unless atan2 bool offset inf nan")

func wordSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}

type promqlTokKind int

const (
	tokIdent    promqlTokKind = iota // metric, label, function or keyword
	tokString                        // a quoted string, unquoted in val
	tokNumber                        // a number or a duration (5m, 1h30m, 1e3, 0x1f)
	tokVariable                      // a Grafana variable: $name, ${name}, ${name:format}
	tokPunct                         // ( ) { } [ ] ,
	tokOp                            // an operator: = != =~ !~ == < <= > >= + - * / % ^ @ :
)

type promqlToken struct {
	kind promqlTokKind
	val  string
	pos  int
}

// lexPromQL splits an expression into tokens.
func lexPromQL(s string) ([]promqlToken, error) {
	var toks []promqlToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // a comment runs to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			val, n, err := lexPromQLString(s[i:])
			if err != nil {
				return nil, fmt.Errorf("at %d: %w", i, err)
			}
			toks = append(toks, promqlToken{tokString, val, i})
			i += n
		case isIdentStart(c):
			j := i + 1
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			toks = append(toks, promqlToken{tokIdent, s[i:j], i})
			i = j
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			j := i + 1
			for j < len(s) {
				if isIdentChar(s[j]) || s[j] == '.' {
					j++
				} else if (s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E') && !strings.HasPrefix(strings.ToLower(s[i:j]), "0x") {
					j++ // 1e-3
				} else {
					break
				}
			}
			toks = append(toks, promqlToken{tokNumber, s[i:j], i})
			i = j
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				end := strings.IndexByte(s[j:], '}')
				if end < 0 {
					return nil, fmt.Errorf("at %d: unterminated ${", i)
				}
				j += end + 1
			} else {
				for j < len(s) && isIdentChar(s[j]) && s[j] != ':' {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("at %d: $ without a variable name", i)
			}
			toks = append(toks, promqlToken{tokVariable, s[i:j], i})
			i = j
		case strings.ContainsRune("(){}[],", rune(c)):
			toks = append(toks, promqlToken{tokPunct, string(c), i})
			i++
		default:
			op := ""
			for _, o := range []string{"!=", "=~", "!~", "==", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "^", "@", ":"} {
				if strings.HasPrefix(s[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				r, _ := utf8.DecodeRuneInString(s[i:])
				return nil, fmt.Errorf("at %d: unexpected character %q", i, r)
			}
			toks = append(toks, promqlToken{tokOp, op, i})
			i += len(op)
		}
	}
	return toks, nil
}

// lexPromQLString reads the quoted string at the start of s and returns its
// value and its length in s. Double and single quotes take Go's escapes,
// backquotes none.
func lexPromQLString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\\' && q != '`':
			if i+1 >= len(s) {
				return "", 0, fmt.Errorf("unterminated string")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			default: // \\ \" \' and a regex's \. stay what they escape
				if s[i] != q && s[i] != '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(s[i])
			}
		case c == '\n' && q != '`':
			return "", 0, fmt.Errorf("newline in string")
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// parsePromQL returns the selectors and grouping labels of an expression,
// or an error for what PromQL would refuse on the way (unbalanced brackets,
// an unknown function, a malformed matcher or label list).
func parsePromQL(expr string) (promqlRefs, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return promqlRefs{}, err
	}
	var refs promqlRefs
	var stack []string // open brackets: "(" or "["
	at := func(i int) promqlToken {
		if i < len(toks) {
			return toks[i]
		}
		return promqlToken{kind: tokPunct, val: "", pos: len(expr)}
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.kind {
		case tokPunct:
			switch t.val {
			case "(":
				stack = append(stack, "(")
			case "[": // a range or subquery: durations, variables, ':'
				j := i + 1
				for ; j < len(toks) && toks[j].val != "]"; j++ {
					if k := toks[j].kind; k != tokNumber && k != tokVariable && toks[j].val != ":" {
						return refs, fmt.Errorf("at %d: %q inside [ ]", toks[j].pos, toks[j].val)
					}
				}
				if j == len(toks) {
					return refs, fmt.Errorf("at %d: unclosed [", t.pos)
				}
				i = j
			case ")":
				if len(stack) == 0 || stack[len(stack)-1] != "(" {
					return refs, fmt.Errorf("at %d: unexpected )", t.pos)
				}
				stack = stack[:len(stack)-1]
			case "{": // a selector without a metric name
				sel, n, err := parseMatchers(toks, i)
				if err != nil {
					return refs, err
				}
				for _, m := range sel.Matchers {
					if m.Label == "__name__" && m.Op == "=" {
						sel.Metric = m.Value
					}
				}
				refs.Selectors = append(refs.Selectors, sel)
				i = n
			case "]", "}":
				return refs, fmt.Errorf("at %d: unexpected %s", t.pos, t.val)
			}
		case tokIdent:
			word := t.val
			lower := strings.ToLower(word) // keywords and aggregations are case-insensitive, functions not
			next := at(i + 1)
			switch {
			case promqlGroupings[lower]:
				if next.val != "(" {
					if lower == "group_left" || lower == "group_right" {
						continue
					}
					return refs, fmt.Errorf("at %d: %s without a label list", t.pos, word)
				}
				labels, n, err := parseLabelList(toks, i+1)
				if err != nil {
					return refs, err
				}
				refs.Grouping = append(refs.Grouping, labels...)
				i = n
			case promqlKeywords[lower]:
				// and, or, unless, atan2, bool, offset; Inf and NaN
			case promqlAggregations[lower] && (next.val == "(" || promqlGroupings[strings.ToLower(next.val)]):
				// the argument list is walked as any parentheses
			case promqlAggregations[lower]:
				return refs, fmt.Errorf("at %d: %s without its arguments", t.pos, word)
			case next.val == "(":
				if !promqlFunctions[word] {
					return refs, fmt.Errorf("at %d: unknown function %q", t.pos, word)
				}
			default: // a metric
				sel := promqlSelector{Metric: word}
				if next.val == "{" {
					withMatchers, n, err := parseMatchers(toks, i+1)
					if err != nil {
						return refs, err
					}
					sel.Matchers = withMatchers.Matchers
					i = n
				}
				refs.Selectors = append(refs.Selectors, sel)
			}
		}
	}
	if len(stack) > 0 {
		return refs, fmt.Errorf("unclosed (")
	}
	return refs, nil
}

// parseMatchers reads `{label op "value", ...}` from toks[i] (the brace)
// and returns the index of the closing brace.
func parseMatchers(toks []promqlToken, i int) (promqlSelector, int, error) {
	var sel promqlSelector
	open := toks[i].pos
	i++
	for {
		if i >= len(toks) {
			return sel, i, fmt.Errorf("at %d: unclosed {", open)
		}
		if toks[i].val == "}" {
			return sel, i, nil
		}
		if i+2 >= len(toks) || toks[i].kind != tokIdent || toks[i+1].kind != tokOp || toks[i+2].kind != tokString {
			return sel, i, fmt.Errorf("at %d: want label op \"value\" in braces", toks[i].pos)
		}
		switch op := toks[i+1].val; op {
		case "=", "!=", "=~", "!~":
			sel.Matchers = append(sel.Matchers, promqlMatcher{Label: toks[i].val, Op: op, Value: toks[i+2].val})
		default:
			return sel, i, fmt.Errorf("at %d: %q is not a label matcher", toks[i+1].pos, op)
		}
		i += 3
		if i < len(toks) && toks[i].val == "," {
			i++
		}
	}
}

// parseLabelList reads `(label, ...)` from toks[i] (the parenthesis) and
// returns the labels and the index of the closing parenthesis.
func parseLabelList(toks []promqlToken, i int) ([]string, int, error) {
	labels := []string{}
	open := toks[i].pos
	for i++; i < len(toks); i++ {
		switch t := toks[i]; {
		case t.val == ")":
			return labels, i, nil
		case t.kind == tokIdent:
			labels = append(labels, t.val)
			if i+1 < len(toks) && toks[i+1].val == "," {
				i++
			}
		default:
			return nil, i, fmt.Errorf("at %d: %q in a label list", t.pos, t.val)
		}
	}
	return nil, i, fmt.Errorf("at %d: unclosed label list", open)
}

// TestParsePromQL: the reader finds every selector and grouping label, and
// nothing else (not functions, keywords, label names, strings, durations
// or variables), and refuses what is malformed.
func TestParsePromQL(t *testing.T) {
	t.Parallel()
	type sel = promqlSelector
	type m = promqlMatcher
	tests := []struct {
		name     string
		expr     string
		want     []sel
		grouping []string
		err      string
	}{
		{name: "bare metric", expr: "up", want: []sel{{Metric: "up"}}},
		{name: "matchers of every kind",
			expr: `caddy_x_total{limiter=~"$limiter", result!="denied",kind!~"a|b", le="+Inf"}`,
			want: []sel{{Metric: "caddy_x_total", Matchers: []m{{"limiter", "=~", "$limiter"}, {"result", "!=", "denied"}, {"kind", "!~", "a|b"}, {"le", "=", "+Inf"}}}}},
		{name: "functions and range with a Grafana interval",
			expr: `sum by (result) (rate(caddy_a_total{limiter=~"$limiter"}[$__rate_interval]))`,
			want: []sel{{Metric: "caddy_a_total", Matchers: []m{{"limiter", "=~", "$limiter"}}}}, grouping: []string{"result"}},
		{name: "histogram quantile",
			expr: `histogram_quantile(0.99, sum by (le, limiter, store) (rate(caddy_d_seconds_bucket[5m])))`,
			want: []sel{{Metric: "caddy_d_seconds_bucket"}}, grouping: []string{"le", "limiter", "store"}},
		{name: "grouping after the arguments, without",
			expr: `sum(rate(a[1m])) without (instance, job)`, want: []sel{{Metric: "a"}}, grouping: []string{"instance", "job"}},
		{name: "vector matching",
			expr: "sum by (limiter, kind) (rate(e[5m])) / on (limiter) group_left sum by (limiter) (rate(r[5m])) > 0.01",
			want: []sel{{Metric: "e"}, {Metric: "r"}}, grouping: []string{"limiter", "kind", "limiter", "limiter"}},
		{name: "group_left with labels, ignoring",
			expr: "a * ignoring(result) group_left(kind, store) b", want: []sel{{Metric: "a"}, {Metric: "b"}},
			grouping: []string{"result", "kind", "store"}},
		{name: "set operators, bool, offset, durations, numbers",
			expr: "a > bool 2 * b offset 1h30m + 0.05 and on (limiter) c >= 1e-3 or d unless e[5m] offset -5m atan2 0x1F",
			want: []sel{{Metric: "a"}, {Metric: "b"}, {Metric: "c"}, {Metric: "d"}, {Metric: "e"}}, grouping: []string{"limiter"}},
		{name: "Inf and NaN are numbers", expr: "a > Inf or b != NaN or c < -inf", want: []sel{{Metric: "a"}, {Metric: "b"}, {Metric: "c"}}},
		{name: "subquery and @", expr: "max_over_time(rate(a[1m])[1h:5m] @ end())", want: []sel{{Metric: "a"}}},
		{name: "recording-rule names", expr: "limiter:caddy_requests:rate5m", want: []sel{{Metric: "limiter:caddy_requests:rate5m"}}},
		{name: "words inside strings are not metrics",
			expr: `label_replace(a, "dst", "$1 rate(b)", "src", "(.*)") or count_values("sum", c)`,
			want: []sel{{Metric: "a"}, {Metric: "c"}}},
		{name: "escapes", expr: `a{path=~"/api/\\d+\"x\"", b='it\'s'}`,
			want: []sel{{Metric: "a", Matchers: []m{{"path", "=~", `/api/\d+"x"`}, {"b", "=", "it's"}}}}},
		{name: "backquotes", expr: "a{re=~`\\d+`}", want: []sel{{Metric: "a", Matchers: []m{{"re", "=~", `\d+`}}}}},
		{name: "label names that are keywords or functions",
			expr: `a{by="x", rate="y", sum="z"}`, want: []sel{{Metric: "a", Matchers: []m{{"by", "=", "x"}, {"rate", "=", "y"}, {"sum", "=", "z"}}}}},
		{name: "selector by __name__", expr: `{__name__="a", job="j"}`,
			want: []sel{{Metric: "a", Matchers: []m{{"__name__", "=", "a"}, {"job", "=", "j"}}}}},
		{name: "comments", expr: "a # rate(b)\n+ c", want: []sel{{Metric: "a"}, {Metric: "c"}}},
		{name: "Grafana variables", expr: "topk(${n}, a[$__range]) * $scale", want: []sel{{Metric: "a"}}},
		{name: "trailing comma in matchers", expr: `a{x="1",}`, want: []sel{{Metric: "a", Matchers: []m{{"x", "=", "1"}}}}},
		{name: "scalar only", expr: "vector(0)", want: nil},
		{name: "keywords before parentheses", expr: "a and (b or c) > bool (d) or vector(0)",
			want: []sel{{Metric: "a"}, {Metric: "b"}, {Metric: "c"}, {Metric: "d"}}},
		{name: "keywords in any case", expr: "SUM BY (x) (a) AND ON (y) b Offset 5m",
			want: []sel{{Metric: "a"}, {Metric: "b"}}, grouping: []string{"x", "y"}},

		{name: "misspelled function", expr: "rtae(a[5m])", err: `unknown function "rtae"`},
		{name: "functions are case-sensitive", expr: "Rate(a[5m])", err: `unknown function "Rate"`},
		{name: "unclosed brace", expr: `a{x="1"`, err: "unclosed {"},
		{name: "unclosed paren", expr: "sum(rate(a[5m])", err: "unclosed ("},
		{name: "stray paren", expr: "a)", err: "unexpected )"},
		{name: "unclosed range", expr: "rate(a[5m)", err: `")" inside [ ]`},
		{name: "unterminated string", expr: `a{x="1}`, err: "unterminated string"},
		{name: "matcher without a string", expr: `a{x=1}`, err: "want label op"},
		{name: "comparison in braces", expr: `a{x=="1"}`, err: `"==" is not a label matcher`},
		{name: "by without a list", expr: "sum by rate(a[5m])", err: "by without a label list"},
		{name: "by list with a string", expr: `sum by ("x") (a)`, err: "in a label list"},
		{name: "aggregation without arguments", expr: "sum", err: "sum without its arguments"},
		{name: "stray character", expr: "a ; b", err: "unexpected character"},
		{name: "empty $", expr: "a[$ ]", err: "$ without a variable name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			refs, err := parsePromQL(tt.expr)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parsePromQL(%q) error %v, want one containing %q", tt.expr, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parsePromQL(%q): %v", tt.expr, err)
			}
			if !reflect.DeepEqual(refs.Selectors, tt.want) {
				t.Errorf("parsePromQL(%q) selectors\n got %+v\nwant %+v", tt.expr, refs.Selectors, tt.want)
			}
			if len(refs.Grouping)+len(tt.grouping) > 0 && !reflect.DeepEqual(refs.Grouping, tt.grouping) {
				t.Errorf("parsePromQL(%q) grouping %q, want %q", tt.expr, refs.Grouping, tt.grouping)
			}
		})
	}
}
