package slidingratelimit

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// scriptSHA is the EVALSHA digest of a script (lua.Decide, lua.DecideLog).
func scriptSHA(t *testing.T, src string) string {
	t.Helper()
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// The values of {http.sliding_ratelimit.source}.
const (
	sourceFailOpen   = string(limiter.SourceFailOpen)
	sourceFailClosed = string(limiter.SourceFailClosed)
	sourceLocal      = string(limiter.SourceLocal)
	sourceDenyCache  = string(limiter.SourceDenyCache)
)

// The placeholders' full names.
const (
	phAllowed         = "http.sliding_ratelimit.allowed"
	phCount           = "http.sliding_ratelimit.count"
	phLimit           = "http.sliding_ratelimit.limit"
	phRemaining       = "http.sliding_ratelimit.remaining"
	phRetryAfter      = "http.sliding_ratelimit.retry_after"
	phRegion          = "http.sliding_ratelimit.region"
	phSource          = "http.sliding_ratelimit.source"
	phNearLimit       = "http.sliding_ratelimit.near_limit"
	phDryRun          = "http.sliding_ratelimit.dry_run"
	phGlobalCount     = "http.sliding_ratelimit.global_count"
	phGlobalLimit     = "http.sliding_ratelimit.global_limit"
	phGlobalRemaining = "http.sliding_ratelimit.global_remaining"
)

// unavailableBody is the 503 body of fail closed.
var unavailableBody = []byte(`{"error":"rate_limiter_unavailable"}` + "\n")

// circuitGauge reads a limiter's circuit_state as a scrape would.
func circuitGauge(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := scrapeGauge(t, "caddy_sliding_ratelimit_circuit_state", name)
	if !ok {
		t.Fatalf("no circuit_state for limiter %s", name)
	}
	return v
}

// scrapeGauge reads a gauge of a limiter as a scrape would; ok is false
// when the scrape has no such sample.
func scrapeGauge(t *testing.T, metric, name string) (float64, bool) {
	t.Helper()
	mfs := scrapeFamilies(t)
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" && l.GetValue() == name {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// newBlackHole listens on loopback, accepts connections and never answers,
// like a Redis that hangs. It is closed at the end of the test.
func newBlackHole(t *testing.T) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), nil
}

// validateMu serialises caddy.Validate: Caddy's TLS app shares one
// certificate cache per process, and two configs cleaned up at once stop
// it twice (a panic).
var validateMu sync.Mutex

// validateConfig loads cfg as Caddy would (modules provisioned and
// validated, nothing started), one config at a time.
func validateConfig(cfg *caddy.Config) error {
	validateMu.Lock()
	defer validateMu.Unlock()
	return caddy.Validate(cfg)
}

// TestMain gives Caddy a config and data directory of the tests' own (its
// autosaved config, instance ID and storage would otherwise go to the
// user's), and removes it and what the tests built outside their
// t.TempDir()s at the end.
func TestMain(m *testing.M) {
	home, err := caddyHome()
	if err != nil {
		fmt.Fprintln(os.Stderr, "caddy's directories for the tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(home)
	if caddyBuild.dir != "" {
		os.RemoveAll(caddyBuild.dir)
	}
	os.Exit(code)
}

// caddyHome points Caddy's config and data directories (XDG_CONFIG_HOME,
// XDG_DATA_HOME; the Caddy processes the tests start inherit them) at a new
// temporary directory. The go command keeps its own settings (GOENV).
func caddyHome() (string, error) {
	if os.Getenv("GOENV") == "" {
		cfg, err := os.UserConfigDir()
		if err != nil {
			return "", err
		}
		os.Setenv("GOENV", filepath.Join(cfg, "go", "env"))
	}
	dir, err := os.MkdirTemp("", "sliding-ratelimit-caddy-home-")
	if err != nil {
		return "", err
	}
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	os.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	caddy.ConfigAutosavePath = filepath.Join(caddy.AppConfigDir(), "autosave.json")
	caddy.DefaultStorage.Path = caddy.AppDataDir()
	return dir, nil
}

// reqOutcome is one request through a handler, as seen by the client and by
// later handlers (the placeholders).
type reqOutcome struct {
	code   int
	source string // {http.sliding_ratelimit.source}
	header http.Header
	repl   *caddy.Replacer
	took   time.Duration
	err    error // ServeHTTP's error
}

// serveOutcome sends one request with the given headers through h (next answers
// 200). Unlike serve it never calls t.Fatal, so goroutines may use it.
func serveOutcome(h *Handler, hdr map[string]string) reqOutcome {
	w, r, repl := newRequest(hdr)
	start := time.Now()
	err := h.ServeHTTP(w, r, nextOK)
	o := reqOutcome{code: w.Code, header: w.Header(), repl: repl, took: time.Since(start), err: err}
	o.source, _ = repl.GetString(phSource)
	return o
}

// mustServe is serveOutcome for the test goroutine: a handler error fails the test.
func mustServe(t *testing.T, h *Handler, hdr map[string]string) reqOutcome {
	t.Helper()
	o := serveOutcome(h, hdr)
	if o.err != nil {
		t.Fatalf("ServeHTTP: %v", o.err)
	}
	return o
}

// expectOutcome checks status and source of one outcome.
func expectOutcome(t *testing.T, what string, o reqOutcome, code int, source string) {
	t.Helper()
	if o.code != code || o.source != source {
		t.Fatalf("%s: status %d, source %q; want %d from %q", what, o.code, o.source, code, source)
	}
}

// errorLogged returns the error field of the first logged line whose
// message or error holds want, and whether there is one.
func errorLogged(logs *observer.ObservedLogs, want string) (string, bool) {
	for _, e := range logs.All() {
		msg := fmt.Sprint(e.ContextMap()["error"])
		if strings.Contains(msg, want) || strings.Contains(e.Message, want) {
			return msg, true
		}
	}
	return "", false
}

// renderLogs renders the observed log lines for a failure message.
func renderLogs(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		fmt.Fprintf(&b, "  %s %s %v\n", e.Level, e.Message, e.ContextMap())
	}
	return b.String()
}

// allAlgorithms lists every algorithm the engine knows, so the tests cover
// the table however it grows.
func allAlgorithms(t *testing.T) []string {
	t.Helper()
	var names []string
	for a := limiter.Algorithm(0); ; a++ {
		if _, err := limiter.ParseAlgorithm(a.String()); err != nil {
			break
		}
		names = append(names, a.String())
	}
	if len(names) == 0 {
		t.Fatal("no algorithm")
	}
	return names
}

// redisBreaker returns the circuit breaker around h's Redis store (shared by
// every handler with the same Redis config).
func redisBreaker(t *testing.T, h *Handler) *limiter.Breaker {
	t.Helper()
	if h.rt.breaker == nil {
		t.Fatal("handler has no circuit breaker")
	}
	return h.rt.breaker
}
