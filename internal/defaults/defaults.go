// Package defaults is the one table of the defaults the front doors share
// (the Caddy handler, httplimit and the Envoy rate limit service), and the
// values their settings may take, so that the three cannot drift apart.
// It imports nothing.
package defaults

// The defaults of a limiter's settings, the same through every front door
// unless its documentation says otherwise (the rate limit service answers
// with the IETF headers alone by default: Envoy adds them to the response).
const (
	// Name is a limiter's name when none is given.
	Name = "default"
	// Fail is what a request meets while its store is down: it passes.
	Fail = "open"
	// Clock is the clock of the decision: the scripts read Redis TIME.
	Clock = "redis"
	// Headers is the rate limit headers sent: the IETF ones and the
	// X-RateLimit ones.
	Headers = "both"
	// WarnAt is the share of a limit at which an admitted request counts
	// as near its limit (near_limit_total).
	WarnAt = 0.85
	// Cost is what one request costs.
	Cost = 1
)

// The values the settings may take.
var (
	FailModes = []string{"open", "closed", "local"}
	Clocks    = []string{"redis", "app"}
)
