package slidingratelimit

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// provisioned is what Provision builds from a Handler's configuration, once per
// load: the engine and its policy, the templates and amounts compiled for
// the hot path, the stores it holds, its metrics, logs and events. A
// Handler's exported fields are its configuration; this is the rest.
type provisioned struct {
	ctx    caddy.Context
	logger *zap.Logger
	now    func() time.Time // tests inject a clock
	// testClock: now is a test's clock, not the wall clock (so a reading
	// of now does not serve what reads the wall clock, see observe).
	testClock bool

	policy     limiter.Policy // built by policy, once per load
	lim        *limiter.Limiter
	limits     []amount // Limit and Limits, in the policy's order
	globals    []amount // GlobalLimit and GlobalLimits
	cost       amount
	concurrent amount
	keyTmpl    template
	// keyHeader is, for a key that is just {http.request.header.<field>},
	// the field in canonical form: a request Caddy's server prepared reads
	// it from the request's header, as Caddy's placeholder does.
	keyHeader  string
	regionTmpl template
	headers    reply.Plan
	refusals   reply.Refusals // the 429, 413 and 503 bodies, see refuse
	statusIn   func(int) bool

	metrics *limitmetrics.Limiter
	logs    logGates
	events  *caddyevents.App
	// top counts the keys it refuses; shared by the limiter's handlers,
	// kept across reloads.
	top *offenders

	storeKey  string // the store's entry in the pool, released in Cleanup
	localKey  string
	ledgerKey string          // the ledger's entry (global_redis)
	ledger    *limiter.Ledger // global_redis: the admin reset forgets a key's grants in it
	breaker   *limiter.Breaker
	// The clients of redis and global_redis and their first PING, for
	// checkAccess.
	redis, ledgerClient   redis.UniversalClient
	redisPing, ledgerPing *pingResult
	memory                *limiter.MemoryStore
	configID              any    // what tells this config from another in the registry
	fingerprt             string // the block's settings, for same-name checks
}

// newProvisioned starts what Provision builds, keeping the logger and the
// clock a test set before Provision (to watch the log, to move time).
func newProvisioned(ctx caddy.Context, pre *provisioned) *provisioned {
	rt := &provisioned{ctx: ctx, logger: ctx.Logger(), now: time.Now, logs: newLogGates()}
	if pre != nil {
		if pre.logger != nil {
			rt.logger = pre.logger
		}
		if pre.now != nil {
			rt.now = pre.now
			rt.testClock = true
		}
	}
	return rt
}
