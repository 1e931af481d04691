package slidingratelimit

// TLS to Redis: a CA, rediss:// URLs, client certificates, a wrong CA.

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestTLS: redis-server with --tls-port and certificates made by the test.
// The limiter connects with `tls { ca ... }` (JSON, Caddyfile, rediss://
// URL) and decides; a wrong CA or the system roots fail with a clear x509
// error in the log and the fail mode; a server that wants a client
// certificate gets one from `cert`/`key`.
func TestTLS(t *testing.T) {
	t.Parallel()
	certs := redistest.NewCerts(t)
	srv := redistest.StartTLS(t, certs)
	wrong := redistest.NewCerts(t) // an unrelated CA

	decides := func(t *testing.T, h *Handler) {
		t.Helper()
		logs := provision(t, h, newTestClock())
		for i := range 3 {
			o := mustServe(t, h, nil)
			if o.code != http.StatusOK || o.source != "redis" {
				t.Fatalf("request %d: status %d source %q, want 200 from redis\n%s", i+1, o.code, o.source, renderLogs(logs))
			}
		}
		expectOutcome(t, "4th", mustServe(t, h, nil), http.StatusTooManyRequests, "redis")
	}
	fails := func(t *testing.T, h *Handler, want ...string) {
		t.Helper()
		logs := provision(t, h, newTestClock())
		o := mustServe(t, h, nil)
		expectOutcome(t, "request", o, http.StatusServiceUnavailable, "fail_closed")
		for _, w := range want {
			if msg, ok := errorLogged(logs, w); !ok {
				t.Errorf("no logged error mentions %q; logs:\n%s", w, renderLogs(logs))
			} else {
				t.Logf("logged: %s", msg)
			}
		}
	}
	// Generous timeouts: a TLS handshake under -race on a busy machine may
	// take longer than the default 250ms dial and 100ms call, and only the
	// first error of a burst is logged, so a timeout would hide the x509
	// cause.
	base := func(r *RedisConfig) *Handler {
		r.Timeout = caddy.Duration(5 * time.Second)
		r.DialTimeout = caddy.Duration(5 * time.Second)
		return &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Fail: "closed", Redis: r}
	}

	t.Run("ca", func(t *testing.T) {
		t.Parallel()
		decides(t, base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: certs.CAFile}}))
	})
	t.Run("caddyfile tls block", func(t *testing.T) {
		t.Parallel()
		h := new(Handler)
		d := caddyfile.NewTestDispenser(`sliding_ratelimit {
			name ` + uniqueName() + `
			limit 3
			window 1m
			fail closed
			redis {
				address ` + srv.Addr() + `
				timeout 5s
				dial_timeout 5s
				tls {
					ca ` + certs.CAFile + `
				}
			}
		}`)
		if err := h.UnmarshalCaddyfile(d); err != nil {
			t.Fatal(err)
		}
		decides(t, h)
	})
	t.Run("rediss url with ca", func(t *testing.T) {
		t.Parallel()
		decides(t, base(&RedisConfig{URL: "rediss://" + srv.Addr(), TLS: &RedisTLS{CA: certs.CAFile}}))
	})
	t.Run("wrong ca", func(t *testing.T) {
		t.Parallel()
		fails(t, base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: wrong.CAFile}}),
			"x509", "certificate signed by unknown authority")
	})
	t.Run("wrong ca, fail open", func(t *testing.T) {
		t.Parallel()
		h := base(&RedisConfig{Addresses: []string{srv.Addr()}, TLS: &RedisTLS{CA: wrong.CAFile}})
		h.Fail = "open"
		logs := provision(t, h, newTestClock())
		expectOutcome(t, "request", mustServe(t, h, nil), http.StatusOK, "fail_open")
		if _, ok := errorLogged(logs, "certificate signed by unknown authority"); !ok {
			t.Errorf("no x509 error logged:\n%s", renderLogs(logs))
		}
	})
	t.Run("rediss url, system roots", func(t *testing.T) {
		t.Parallel()
		fails(t, base(&RedisConfig{URL: "rediss://" + srv.Addr()}), "x509", "certificate signed by unknown authority")
	})
	t.Run("client certificate", func(t *testing.T) {
		t.Parallel()
		mtls := redistest.StartTLS(t, certs, "--tls-auth-clients", "yes")
		decides(t, base(&RedisConfig{Addresses: []string{mtls.Addr()},
			TLS: &RedisTLS{CA: certs.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile}}))
		fails(t, base(&RedisConfig{Addresses: []string{mtls.Addr()}, TLS: &RedisTLS{CA: certs.CAFile}}))
	})
}
