package slidingratelimit

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

// FuzzCaddyfile: any sliding_ratelimit block either fails to parse with an
// error, or parses into a config that Caddy then provisions and validates
// (in that order, as Caddy does). Never a panic, and never a config that
// parses but is refused later, but for the one check that needs the whole
// config (which placeholders its handlers provide, checkAmounts): a limit,
// global_limit, cost or max_concurrent with a placeholder nothing provides,
// refused at load naming the directive and the placeholder.
// unknownAmountPlaceholder is checkAmounts' refusal: the directive, its
// value, then the placeholder.
var unknownAmountPlaceholder = regexp.MustCompile(`(?s)(^|: )(limit|global_limit|cost|max_concurrent) .*: placeholder \{[^}]*\} is not one that Caddy or a handler of this config provides`)

func FuzzCaddyfile(f *testing.F) {
	for _, s := range []string{
		"limit 5\nwindow 1m",
		"limit {http.request.header.X-Tier}\nwindow 1s\ncost 2",
		"limit 5\nwindow 1m\nregion {http.request.header.X-Region}\nglobal_limit 9",
		"limit 5\nwindow 1m\nglobal_limit 9",
		"limit 5\nwindow 1m\ncost 6",
		"limit 5\nwindow 0.5ms",
		"limit 5\nwindow 1d\nalgorithm token_bucket\nburst 9",
		"limit 5\nwindow 1m\nredis redis://localhost:6379/2 {\nkey_prefix rl:\n}",
		"limit 5\nwindow 1m\nredis {\naddress a:1 b:2\ndb 1\n}",
		"limit 5\nwindow 1m\nredis {\naddress a:1\ntls {\ncert c\n}\n}",
		"limit 5\nwindow 1m\nwarn_at 1.5",
		"limit 5\nwindow 1m\nname {a}",
		"limit 99999999999999999999\nwindow 1m",
		"limit 5\nwindow 1m\ndeny_cache 0",
		"{\n}\n}",
		"limit \"5\x00\"\nwindow 1m",
		"limit {} 1s",
		"limit 5 1m\ncost {nobody_sets_this}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		// Tokenize as Caddy does (NewTestDispenser exits the process on a
		// tokenizer error, such as a bad heredoc marker).
		tokens, err := caddyfile.Tokenize([]byte("sliding_ratelimit {\n"+body+"\n}"), "Caddyfile")
		if err != nil {
			return
		}
		d := caddyfile.NewDispenser(tokens)
		var h Handler
		if err := h.UnmarshalCaddyfile(d); err != nil {
			return
		}
		if h.Redis != nil && strings.Contains(h.Redis.URL, "{") {
			// A placeholder in the URL ({env.REDIS_URL}) is resolved, and
			// the URL checked, when the config loads, not when it parses.
			return
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		defer cancel()
		if err := h.Provision(ctx); err != nil {
			var ce *configError
			if !errors.As(err, &ce) || !unknownAmountPlaceholder.MatchString(err.Error()) {
				t.Fatalf("parsed, then refused by Provision: %v\n%s", err, body)
			}
			return
		}
		defer h.Cleanup()
		if err := h.Validate(); err != nil {
			t.Fatalf("parsed and provisioned, then refused by Validate: %v\n%s", err, body)
		}
	})
}

// FuzzHostileHeaders: header values of any bytes, as key, region, cost
// and limit, never panic the handler, never make it fail open (every 200 and
// 429 is decided by the store: {http.sliding_ratelimit.source} says so), and
// answer 200, 429, 413, or a 500 for a limit or cost that is not a number.
func FuzzHostileHeaders(f *testing.F) {
	for _, s := range hostileValues() {
		f.Add(s, s, "1", "5")
	}
	f.Add("k", "us", "99999999999999999999", "5")
	f.Add("k", "us", "-1", "{")
	h := &Handler{Name: "fuzz", Key: "{http.request.header.X-Key}", Region: "{http.request.header.X-Region}",
		Limit: "{http.request.header.X-Limit}", Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(time.Minute)}
	provisionF(f, h)
	f.Fuzz(func(t *testing.T, key, region, cost, limit string) {
		w, r, repl := newRequest(map[string]string{"X-Key": key, "X-Region": region, "X-Cost": cost, "X-Limit": limit})
		err := h.ServeHTTP(w, r, nextOK)
		if err != nil {
			if _, perr := parsePositive(cost); perr == nil {
				if _, lerr := parsePositive(limit); lerr == nil {
					t.Fatalf("error with a valid cost and limit: %v", err)
				}
			}
			return
		}
		source, _ := repl.GetString(phSource)
		switch w.Code {
		case http.StatusOK, http.StatusTooManyRequests:
			if source != "memory" {
				t.Fatalf("status %d decided by %q, want the store (memory)", w.Code, source)
			}
		case http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d", w.Code)
		}
	})
}

func hostileValues() []string {
	return []string{"", "{", "}", "{a}:b", "*", "=", "\x00", "a\x00b", "\xff", "\r\n", strings.Repeat("z", 1<<20)}
}

// provisionF provisions h for a fuzz target (the test helper needs a *T).
func provisionF(f *testing.F, h *Handler) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: f.Context()})
	f.Cleanup(func() { h.Cleanup(); cancel() })
	if err := h.Provision(ctx); err != nil {
		f.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		f.Fatal(err)
	}
	h.rt.logger = zap.NewNop()
}
