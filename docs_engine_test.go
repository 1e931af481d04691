package slidingratelimit

// What docs/reference.md says of count_only's check and of a sliding
// counter's t, held to what the engine does.

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func readReference(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// TestCountOnlyDeniesWhenCountPlusCostExceeds: with count_only, a key at 2
// of 3 is not at its limit, and a request of cost 2 is denied all the
// same (2 + 2 > 3); the reference says so, not "when the key is already at
// its limit".
func TestCountOnlyDeniesWhenCountPlusCostExceeds(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "3", Window: caddy.Duration(time.Minute),
		CountOnly: []string{"401"}, Cost: "{http.request.header.X-Cost}"}
	provision(t, h, newTestClock())
	fail := caddyHandlerStatus(http.StatusUnauthorized)
	for i := range 2 {
		w, r, _ := newRequest(map[string]string{"X-API-Key": "K", "X-Cost": "1"})
		if err := h.ServeHTTP(w, r, fail); err != nil || w.Code != http.StatusUnauthorized {
			t.Fatalf("failed login %d: %d %v", i+1, w.Code, err)
		}
	}
	if o := mustServe(t, h, map[string]string{"X-API-Key": "K", "X-Cost": "2"}); o.code != http.StatusTooManyRequests {
		t.Fatalf("cost 2 at 2 of 3: %d, want 429 (2 + 2 > 3)", o.code)
	}
	if o := mustServe(t, h, map[string]string{"X-API-Key": "K", "X-Cost": "1"}); o.code != http.StatusOK {
		t.Fatalf("cost 1 at 2 of 3: %d, want 200", o.code)
	}
	ref := readReference(t)
	if strings.Contains(ref, "already at its limit") || strings.Contains(ref, "denied when its key is at its limit") {
		t.Error("docs/reference.md says count_only denies when the key is at its limit: it denies when count + cost exceeds it")
	}
	for _, want := range []string{"denied when the key's count plus the request's cost would exceed the limit: at 2 of 3, a cost of 2 is denied",
		"denied when its key's count plus its cost would exceed the limit"} {
		if !strings.Contains(ref, want) {
			t.Errorf("docs/reference.md does not say %q", want)
		}
	}
}

// TestSlidingCounterTWithinW: one request 50 s into a minute gets t=60
// beside w=60: in format 3 a bucket's units count whole while its first
// arrival is in the window, so the estimate drops by one once that arrival
// leaves it, never later; the reference says so, and when t can exceed w
// (the counter's format 2).
func TestSlidingCounterTWithinW(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Algorithm: "sliding_counter", Key: "{http.request.header.X-API-Key}", Limit: "10",
		Window: caddy.Duration(time.Minute), Headers: "ietf"}
	clock := newTestClock()
	clock.Set(time.Date(2026, 11, 29, 12, 0, 50, 0, time.UTC))
	provision(t, h, clock)
	o := mustServe(t, h, map[string]string{"X-API-Key": "K"})
	if p, rl := o.header.Get("RateLimit-Policy"), o.header.Get("RateLimit"); !strings.HasSuffix(p, ";w=60") || !strings.HasSuffix(rl, ";t=60") {
		t.Fatalf("RateLimit-Policy %q, RateLimit %q: want w=60 and t=60", p, rl)
	}
	if want := "For a sliding counter `t` is at most `w`"; !strings.Contains(readReference(t), want) {
		t.Errorf("docs/reference.md does not say %q", want)
	}
}

// caddyHandlerStatus is a next handler that answers status.
type caddyHandlerStatus int

func (s caddyHandlerStatus) ServeHTTP(w http.ResponseWriter, _ *http.Request) error {
	w.WriteHeader(int(s))
	return nil
}
