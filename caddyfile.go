package slidingratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("sliding_ratelimit", parseCaddyfile)
	// Rate limit before authentication, so a flood of anonymous requests is
	// turned away before it costs a password hash; no `order` option needed.
	httpcaddyfile.RegisterDirectiveOrder("sliding_ratelimit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	if err := m.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return m, checkBlockNames(h, m)
}

// blocksSeen is the Caddyfile adaptation's state key for the blocks parsed
// so far, by limiter name.
const blocksSeen = "sliding_ratelimit.blocks"

type seenBlock struct {
	at          string // file:line of its name, or of the directive
	fingerprint string
}

// checkBlockNames refuses, with the line to fix, a second block of the
// Caddyfile under the name of an earlier one, unless both name it on
// purpose with the same settings (the same limiter, one budget). A block
// in a site with several addresses is parsed once: one limiter, whatever
// the servers it ends up in.
func checkBlockNames(h httpcaddyfile.Helper, m *Handler) error {
	seen, _ := h.State[blocksSeen].(map[string]seenBlock)
	if seen == nil {
		seen = map[string]seenBlock{}
		h.State[blocksSeen] = seen
	}
	h.Reset()
	h.Next()
	at := h.Token()
	for h.NextBlock(0) {
		if h.Val() == "name" {
			at = h.Token()
		}
	}
	d := caddyfile.NewDispenser([]caddyfile.Token{at})
	d.Next()
	fp, _ := json.Marshal(m)
	name := m.Name
	if name == "" {
		name = DefaultName
	}
	prev, ok := seen[name]
	here := fmt.Sprintf("%s:%d", at.File, at.Line)
	if !ok {
		seen[name] = seenBlock{at: here, fingerprint: string(fp)}
		return nil
	}
	// The message names both blocks: inside a route or handle, Caddy adds
	// the closing brace of the enclosing block after this line.
	switch {
	case m.Name == "" && prev.at == here:
		return d.Errf("sliding_ratelimit: the block at %s is used twice (a snippet imported twice?) and left at the default name %q: give it a name (name <string>), the same name meaning one limiter and one budget", here, DefaultName)
	case m.Name == "":
		return d.Errf("sliding_ratelimit: two blocks left at the default name %q, at %s and %s: give each block its own name (name <string>), or they would share one budget", DefaultName, prev.at, here)
	case prev.fingerprint != string(fp):
		return d.Errf("sliding_ratelimit: two blocks named %q with different settings, at %s and %s: give each its own name (the same name means the same limiter and one budget)", name, prev.at, here)
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	sliding_ratelimit [<matcher>] {
//		name          <string>
//		algorithm     sliding_log | sliding_counter | fixed_window | token_bucket
//		key           <template>
//		region        <template>
//		limit         <n | placeholder> [<window> | hour | day | week | month]
//		window        <duration>
//		global_limit  <n | placeholder> [<window> | hour | day | week | month]
//		timezone      <IANA name>
//		cost          <n | placeholder>
//		burst         <n>
//		ban           <duration> after <n> within <duration>
//		max_concurrent <n | placeholder>
//		lease_timeout <duration>
//		count_only    status <code | class>...
//		queue         <max_wait> [<max_waiters>]
//		jitter        <duration | percent>
//		fail          open | closed | local
//		clock         redis | app
//		headers       both | ietf | legacy | off
//		warn_at       <ratio> | off
//		log_key
//		dry_run
//		on_limit      respond | error
//		deny_cache    on | off | <max keys>
//		redis         <url>
//		redis {
//			address      <host:port>...
//			cluster
//			sentinel     <master_name>
//			sentinel_password <password>
//			username     <user>
//			password     <password>
//			db           <n>
//			tls          [insecure_skip_verify]
//			tls {
//				ca          <file>
//				cert        <file>
//				key         <file>
//				server_name <name>
//				insecure_skip_verify
//			}
//			dial_timeout <duration>
//			timeout      <duration>
//			pool_size    <n>
//			pipeline     <n> | off
//			key_prefix   <string>
//			scripts      functions | eval
//			state_format 1 | 2 | 3 | 4
//		}
//		global_redis  <url>
//		global_redis {
//			address      <host:port> | <sentinel host:port>...
//			sentinel     <master_name>
//			...          the redis block's: sentinel_password, username, password, db, tls, dial_timeout, timeout (default 1s), pool_size
//		}
//		datacenter    <name>
//	}
//
// A limit is required: `limit <n>` with `window`, or `limit <n> <window>`,
// as many as there are windows. The parser checks syntax; the values are
// checked by the same code Validate runs, and a bad one fails the load with
// the line of the subdirective to fix.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	start := d.Token()
	if d.NextArg() {
		return d.ArgErr()
	}
	// pos holds the line of every subdirective by the configuration field
	// it sets (limit, limits[1], redis.timeout, ...), so a check failing
	// later points at the line to fix.
	pos := map[string]caddyfile.Token{}
	for d.NextBlock(0) {
		sub := d.Val()
		if !repeatable(sub) {
			if first, seen := pos[sub]; seen {
				return d.Errf("%s given twice (first on line %d): give it once", sub, first.Line)
			}
			pos[sub] = d.Token()
		}
		if err := h.subdirective(d, sub, pos); err != nil {
			return err
		}
	}
	if err := h.checkParsed(start, pos); err != nil {
		return err
	}
	rememberAmountLines(h, pos)
	return nil
}

// repeatable are the subdirectives that may appear more than once: limits
// with their own window, one line per window.
func repeatable(sub string) bool { return sub == "limit" || sub == "global_limit" }

// subdirective reads one subdirective of the block.
func (h *Handler) subdirective(d *caddyfile.Dispenser, sub string, pos map[string]caddyfile.Token) error {
	switch sub {
	case "name", "algorithm", "key", "region", "timezone", "jitter", "cost", "max_concurrent", "datacenter":
		return h.stringSub(d, sub)
	case "limit", "global_limit":
		return h.limitSub(d, sub, pos)
	case "window", "lease_timeout":
		return h.durationSub(d, sub)
	case "fail", "clock", "headers", "on_limit":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		field, _ := h.enum(sub)
		*field = v
	case "burst":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		n, err := parsePositive(v)
		if err != nil {
			return d.Errf("burst must be a positive integer, got '%s'", v)
		}
		h.Burst = n
	case "ban":
		return h.banSub(d)
	case "count_only":
		args := d.RemainingArgs()
		if len(args) < 2 || args[0] != "status" {
			return d.Err("count_only takes: count_only status <code | class>... (count_only status 401 403, count_only status 5xx)")
		}
		h.CountOnly = args[1:]
	case "queue":
		return h.queueSub(d)
	case "warn_at":
		return h.warnAtSub(d)
	case "log_key", "dry_run":
		if d.NextArg() {
			return d.Errf("%s takes no value, got '%s'", sub, d.Val())
		}
		if sub == "log_key" {
			h.LogKey = true
		} else {
			h.DryRun = true
		}
	case "deny_cache":
		return h.denyCacheSub(d)
	case "redis", "global_redis":
		c := new(RedisConfig)
		if sub == "redis" {
			h.Redis = c
		} else {
			h.GlobalRedis = c
		}
		return c.unmarshalCaddyfile(d, pos, sub)
	default:
		return d.Errf("unrecognized sliding_ratelimit subdirective '%s'", sub)
	}
	return nil
}

// stringSub reads a subdirective of one string value.
func (h *Handler) stringSub(d *caddyfile.Dispenser, sub string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	switch sub {
	case "name":
		h.Name = v
	case "algorithm":
		h.Algorithm = v
	case "key":
		h.Key = v
	case "region":
		h.Region = v
	case "timezone":
		h.Timezone = v
	case "jitter":
		h.Jitter = v
	case "cost":
		h.Cost = Amount(v)
	case "max_concurrent":
		h.MaxConcurrent = Amount(v)
	case "datacenter":
		h.Datacenter = v
	}
	return nil
}

// limitSub reads `limit <n> [<window>]` or `global_limit <n> [<window>]`:
// without a window it sets Limit (GlobalLimit), with one it adds a window
// to Limits (GlobalLimits).
func (h *Handler) limitSub(d *caddyfile.Dispenser, sub string, pos map[string]caddyfile.Token) error {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return d.Errf("%s takes a limit and an optional window (%s 100 1m), got %d values", sub, sub, len(args))
	}
	a := Amount(args[0])
	if len(args) == 1 {
		first := &h.Limit
		if sub == "global_limit" {
			first = &h.GlobalLimit
		}
		if *first != "" {
			return d.Errf("%s %s given twice without a window (first on line %d): give each its window (%s %s 1m)", sub, args[0], pos[sub].Line, sub, args[0])
		}
		*first = a
		pos[sub] = d.Token()
		return nil
	}
	lc := LimitConfig{Limit: a}
	if _, ok := limiter.ParsePeriod(args[1]); ok {
		lc.Period = args[1]
	} else {
		dur, err := caddy.ParseDuration(args[1])
		if err != nil {
			return d.Errf("%s: bad window '%s': want a duration (1m) or hour, day, week, month", sub, args[1])
		}
		if dur == 0 { // else taken for no window at all
			return d.Errf("%s %s %s: window must be at least 1ms, got 0s", sub, args[0], args[1])
		}
		lc.Window = caddy.Duration(dur)
	}
	list := &h.Limits
	if sub == "global_limit" {
		list = &h.GlobalLimits
	}
	pos[fmt.Sprintf("%ss[%d]", sub, len(*list))] = d.Token()
	*list = append(*list, lc)
	return nil
}

// durationSub reads `window <duration>` or `lease_timeout <duration>`.
func (h *Handler) durationSub(d *caddyfile.Dispenser, sub string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return d.Errf("%s: bad duration '%s': %v", sub, v, err)
	}
	if sub == "window" {
		if dur == 0 { // else taken for no window at all
			return d.Errf("window must be at least 1ms, got 0s")
		}
		h.Window = caddy.Duration(dur)
	} else {
		h.LeaseTimeout = caddy.Duration(dur)
	}
	return nil
}

// banSub reads `ban <duration> after <n> within <duration>`.
func (h *Handler) banSub(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 5 || args[1] != "after" || args[3] != "within" {
		return d.Errf("ban takes: ban <duration> after <n> within <duration> (ban 1h after 20 within 10s), got '%s'", strings.Join(args, " "))
	}
	dur, err1 := caddy.ParseDuration(args[0])
	n, err2 := parsePositive(args[2])
	within, err3 := caddy.ParseDuration(args[4])
	if err := errors.Join(err1, err2, err3); err != nil {
		return d.Errf("ban %s: %v", strings.Join(args, " "), err)
	}
	h.Ban = &BanConfig{For: caddy.Duration(dur), After: n, Within: caddy.Duration(within)}
	return nil
}

// queueSub reads `queue <max_wait> [<max_waiters>]`.
func (h *Handler) queueSub(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return d.Err("queue takes: queue <max_wait> [<max_waiters>]")
	}
	dur, err := caddy.ParseDuration(args[0])
	if err != nil {
		return d.Errf("queue: bad duration '%s': %v", args[0], err)
	}
	h.Queue = &QueueConfig{MaxWait: caddy.Duration(dur)}
	if len(args) == 2 {
		n, err := strconv.Atoi(args[1])
		if err != nil || n <= 0 {
			return d.Errf("queue: max_waiters must be a positive integer, got '%s'", args[1])
		}
		h.Queue.MaxWaiters = n
	}
	return nil
}

// warnAtSub reads `warn_at <ratio> | off`.
func (h *Handler) warnAtSub(d *caddyfile.Dispenser) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if v == "off" {
		h.WarnAt = -1
		return nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1 {
		return d.Errf("warn_at must be a share of the limit in (0, 1], or off, got '%s'", v)
	}
	h.WarnAt = f
	return nil
}

// denyCacheSub reads `deny_cache on | off | <max keys>`.
func (h *Handler) denyCacheSub(d *caddyfile.Dispenser) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	switch v {
	case "off":
		h.DenyCacheSize = -1
	case "on":
		h.DenyCacheSize = 0
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return d.Errf("deny_cache must be on, off or a number of keys, got '%s'", v)
		}
		h.DenyCacheSize = n
	}
	return nil
}

// checkParsed runs the configuration checks (the ones Validate runs) and
// points a failure at the line of the subdirective to fix, or at the
// directive when the fault is a missing one.
func (h *Handler) checkParsed(start caddyfile.Token, pos map[string]caddyfile.Token) error {
	err := h.validate()
	if err == nil {
		return nil
	}
	tok := start
	var ce *configError
	if errors.As(err, &ce) {
		// The message names the subdirective; the line is the one to fix.
		err = fmt.Errorf("sliding_ratelimit: %w", ce.err)
		if t, ok := pos[ce.field]; ok {
			tok = t
		} else if t, ok := pos[strings.SplitN(ce.field, ".", 2)[0]]; ok {
			tok = t
		}
	}
	at := caddyfile.NewDispenser([]caddyfile.Token{tok})
	at.Next()
	return at.WrapErr(err)
}

// unmarshalCaddyfile reads `<dir> <url>` or a `<dir> { ... }` block, dir
// being redis or global_redis (the same forms).
func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser, pos map[string]caddyfile.Token, dir string) error {
	if d.NextArg() {
		c.URL = d.Val()
		pos[dir+".url"] = d.Token()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if first, seen := pos[dir+"."+sub]; seen && sub != "address" {
			return d.Errf("%s %s given twice (first on line %d): give it once", dir, sub, first.Line)
		}
		if _, seen := pos[dir+"."+sub]; !seen {
			pos[dir+"."+sub] = d.Token()
		}
		if err := c.subdirective(d, sub, dir); err != nil {
			return err
		}
	}
	return nil
}

// subdirective reads one subdirective of a `redis { ... }` (or
// `global_redis { ... }`) block.
func (c *RedisConfig) subdirective(d *caddyfile.Dispenser, sub, dir string) error {
	switch sub {
	case "address":
		if !d.NextArg() {
			return d.ArgErr()
		}
		c.Addresses = append(c.Addresses, d.Val())
		c.Addresses = append(c.Addresses, d.RemainingArgs()...)
	case "cluster":
		if d.NextArg() {
			return d.ArgErr()
		}
		c.Cluster = true
	case "tls":
		c.TLS = new(RedisTLS)
		return c.TLS.unmarshalCaddyfile(d, dir)
	case "sentinel", "sentinel_password", "username", "password", "key_prefix", "scripts":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		*map[string]*string{"sentinel": &c.Sentinel, "sentinel_password": &c.SentinelPassword,
			"username": &c.Username, "password": &c.Password, "key_prefix": &c.KeyPrefix, "scripts": &c.Scripts}[sub] = v
	case "db", "pool_size", "state_format":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if sub == "state_format" && (err != nil || n < 1 || n > 4) {
			return d.Errf("%s state_format must be 1, 2, 3 or 4, got '%s'", dir, v)
		}
		if err != nil || n < 0 || sub == "pool_size" && n == 0 {
			return d.Errf("%s %s must be a %s integer, got '%s'", dir, sub, map[string]string{"db": "non-negative", "pool_size": "positive"}[sub], v)
		}
		*map[string]*int{"db": &c.DB, "pool_size": &c.PoolSize, "state_format": &c.StateFormat}[sub] = n
	case "dial_timeout", "timeout":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return d.Errf("%s %s: bad duration '%s'", dir, sub, v)
		}
		if sub == "timeout" {
			c.Timeout = caddy.Duration(dur)
		} else {
			c.DialTimeout = caddy.Duration(dur)
		}
	case "pipeline":
		return c.pipelineSub(d, dir)
	default:
		return d.Errf("unrecognized sliding_ratelimit %s subdirective '%s'", dir, sub)
	}
	return nil
}

// pipelineSub reads `pipeline <n> | off`.
func (c *RedisConfig) pipelineSub(d *caddyfile.Dispenser, dir string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	if v == "off" {
		c.Pipeline = -1
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 64 {
		return d.Errf("%s pipeline must be off or 1 to 64, got '%s'", dir, v)
	}
	c.Pipeline = n
	return nil
}

// unmarshalCaddyfile reads `tls`, `tls insecure_skip_verify` or a
// `tls { ca; cert; key; server_name; insecure_skip_verify }` block.
func (t *RedisTLS) unmarshalCaddyfile(d *caddyfile.Dispenser, dir string) error {
	for d.NextArg() {
		if d.Val() != "insecure_skip_verify" {
			return d.Errf("%s tls: unknown option '%s'", dir, d.Val())
		}
		t.InsecureSkipVerify = true
	}
	seen := map[string]int{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if line, ok := seen[sub]; ok {
			return d.Errf("%s tls %s given twice (first on line %d): give it once", dir, sub, line)
		}
		seen[sub] = d.Line()
		if sub == "insecure_skip_verify" {
			t.InsecureSkipVerify = true
			continue
		}
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		switch sub {
		case "ca":
			t.CA = v
		case "cert":
			t.Cert = v
		case "key":
			t.Key = v
		case "server_name":
			t.ServerName = v
		default:
			return d.Errf("unrecognized sliding_ratelimit %s tls subdirective '%s'", dir, sub)
		}
	}
	return nil
}

// oneArg returns the single argument of the current subdirective.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	sub := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", sub)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value, got more: '%s'", sub, d.Val())
	}
	return v, nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
