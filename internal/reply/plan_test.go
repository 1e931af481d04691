package reply

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestHeaderValuesStandAlone: the values of one response's rate limit
// headers share one allocation, yet each header is its own: a later limiter
// adds its IETF members, the legacy headers follow the tightest limiter, and
// a later handler that appends to one header or rewrites its value leaves
// the others as they were.
func TestHeaderValuesStandAlone(t *testing.T) {
	t.Parallel()
	hp := Plan{Legacy: true, IETF: true}
	decision := func(name string, limit, count int64) *limiter.Decision {
		return &limiter.Decision{Windows: []limiter.WindowUsage{{Policy: name, Limit: limit, Seconds: 60, Known: true,
			Count: count, Remaining: limit - count, Reset: 30 * time.Second}}}
	}
	hdr := http.Header{}
	hp.Write(hdr, decision("per_key", 100, 1))
	hp.Write(hdr, decision("per_ip", 10, 8))
	hp.Write(hdr, decision("loose", 1000, 1))
	want := http.Header{
		HdrLimit:     {"10"},
		HdrRemaining: {"2"},
		HdrPolicy:    {`"per_key";q=100;w=60`, `"per_ip";q=10;w=60`, `"loose";q=1000;w=60`},
		HdrRateLimit: {`"per_key";r=99;t=30`, `"per_ip";r=2;t=30`, `"loose";r=999;t=30`},
	}
	check := func(when string) {
		t.Helper()
		for k, v := range want {
			if !slices.Equal(hdr[k], v) {
				t.Errorf("%s: %s = %q, want %q", when, k, hdr[k], v)
			}
		}
	}
	check("three limiters")

	one := http.Header{}
	hp.Write(one, decision("solo", 5, 1))
	one[HdrLimit] = append(one[HdrLimit], "appended")
	one[HdrPolicy][0] = "rewritten"
	if got := one[HdrRemaining]; !slices.Equal(got, []string{"4"}) {
		t.Errorf("after an append to %s: %s = %q", HdrLimit, HdrRemaining, got)
	}
	if got := one[HdrRateLimit]; !slices.Equal(got, []string{`"solo";r=4;t=30`}) {
		t.Errorf("after a rewrite of %s: %s = %q", HdrPolicy, HdrRateLimit, got)
	}
	check("another response's headers changed")
}
