package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Amount is a positive integer given either as a number or as a template
// with placeholders resolved per request (e.g. "{tier_limit}" set by Caddy's
// map handler). In JSON it is a number when static and a string otherwise.
type Amount string

// MarshalJSON writes a static amount as a JSON number.
func (a Amount) MarshalJSON() ([]byte, error) {
	if _, err := strconv.ParseInt(string(a), 10, 64); err == nil {
		return []byte(a), nil
	}
	return json.Marshal(string(a))
}

// UnmarshalJSON accepts a number or a string.
func (a *Amount) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*a = Amount(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a number or a placeholder string, got %s", b)
	}
	*a = Amount(n.String())
	return nil
}

// isDynamic reports whether the amount holds a placeholder.
func (a Amount) isDynamic() bool { return strings.ContainsRune(string(a), '{') }

// errNotPositive is wrapped by every "not a positive integer" error.
var errNotPositive = errors.New("not a positive integer up to 2^50")

// parsePositive parses a positive integer, at most limiter.MaxValue (the
// scripts compute in doubles: larger values would not be exact).
func parsePositive(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > limiter.MaxValue {
		return 0, errNotPositive
	}
	return n, nil
}

// checkStatic validates an amount at config time: a static value must be a
// positive integer; a dynamic one is checked per request.
func (a Amount) checkStatic(what string) error {
	if a == "" || a.isDynamic() {
		return nil
	}
	if _, err := parsePositive(string(a)); err != nil {
		return fmt.Errorf("%s must be a positive integer (at most 2^50) or a placeholder, got '%s'", what, string(a))
	}
	return nil
}

// amount is an Amount ready for the hot path: a parsed static value, or a
// template to resolve.
type amount struct {
	static int64
	tmpl   string
	t      template
}

func compileAmount(a Amount, def int64) amount {
	if a == "" {
		return amount{static: def}
	}
	if a.isDynamic() {
		return amount{tmpl: string(a), t: compileTemplate(string(a))}
	}
	n, _ := parsePositive(string(a))
	return amount{static: n}
}

// dynamicAmountError says which placeholder resolved to what.
type dynamicAmountError struct {
	what, tmpl, value string
}

func (e *dynamicAmountError) Error() string {
	return fmt.Sprintf("%s %s resolved to '%s', %v", e.what, e.tmpl, e.value, errNotPositive)
}

func (e *dynamicAmountError) Unwrap() error { return errNotPositive }

// resolve returns the amount for this request.
func (a amount) resolve(repl *caddy.Replacer, what string) (int64, error) {
	if a.tmpl == "" {
		return a.static, nil
	}
	v := a.t.expand(repl)
	n, err := parsePositive(v)
	if err != nil {
		if len(v) > 64 {
			v = v[:64] + "..."
		}
		return 0, &dynamicAmountError{what: what, tmpl: a.tmpl, value: v}
	}
	return n, nil
}

// template is a placeholder template compiled for the hot path: a template
// that is exactly one placeholder ("{http.request.header.X-API-Key}") is
// looked up directly, without parsing the template on every request.
type template struct {
	raw    string
	single string // the placeholder's name, when raw is just "{name}"
	// bare is what raw resolves to when every placeholder resolves to
	// nothing; perRequest is whether any placeholder may differ per request.
	bare       string
	perRequest bool
}

func compileTemplate(raw string) template {
	// Placeholders of no request ({env.*}, {system.*}) resolve as they will
	// per request; the others to nothing.
	t := template{raw: raw, bare: caddy.NewReplacer().ReplaceAll(raw, "")}
	for _, name := range templatePlaceholders(raw) {
		t.perRequest = t.perRequest || !hasAnyPrefix(name, staticPlaceholders)
	}
	if len(raw) > 2 && raw[0] == '{' && raw[len(raw)-1] == '}' &&
		strings.Count(raw, "{") == 1 && strings.Count(raw, "}") == 1 && !strings.Contains(raw, `\`) {
		t.single = raw[1 : len(raw)-1]
	}
	return t
}

// empty reports whether v, what the template resolved to, is what every
// request with no value for its placeholders gets: one shared bucket.
func (t *template) empty(v string) bool { return t.perRequest && v == t.bare }

// expand resolves the template for a request; unknown placeholders are "".
func (t template) expand(repl *caddy.Replacer) string {
	if t.single != "" {
		v, _ := repl.GetString(t.single)
		return v
	}
	return repl.ReplaceAll(t.raw, "")
}
