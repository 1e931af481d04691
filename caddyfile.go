package slidingratelimit

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"

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
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	sliding_ratelimit [<matcher>] {
//		name          <string>
//		algorithm     sliding_log | sliding_counter | fixed_window | token_bucket
//		key           <template>
//		region        <template>
//		limit         <n | placeholder>
//		global_limit  <n | placeholder>
//		cost          <n | placeholder>
//		window        <duration>
//		burst         <n>
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
//		}
//	}
//
// limit and window are required. Every value is checked here, so a bad
// Caddyfile fails to load with a message naming the subdirective.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		sub := d.Val()
		switch sub {
		case "name":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if err := limiter.ValidName(v); err != nil {
				return d.Errf("name: %v", err)
			}
			h.Name = v
		case "algorithm":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if _, err := limiter.ParseAlgorithm(v); err != nil {
				return d.Errf("algorithm: %v", err)
			}
			h.Algorithm = v
		case "key":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			h.Key = v
		case "region":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			h.Region = v
		case "limit", "global_limit", "cost":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			a := Amount(v)
			if err := a.checkStatic(sub); err != nil {
				return d.Err(err.Error())
			}
			switch sub {
			case "limit":
				h.Limit = a
			case "global_limit":
				h.GlobalLimit = a
			default:
				h.Cost = a
			}
		case "window":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("window: bad duration '%s': %v", v, err)
			}
			if dur < time.Millisecond {
				return d.Errf("window must be at least 1ms, got '%s'", v)
			}
			h.Window = caddy.Duration(dur)
		case "fail", "clock", "headers", "on_limit":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			field, allowed := h.enum(sub)
			if err := oneOf(sub, v, allowed...); err != nil {
				return d.Err(err.Error())
			}
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
		case "warn_at":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if v == "off" {
				h.WarnAt = -1
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 1 {
				return d.Errf("warn_at must be a share of the limit in (0, 1], or off, got '%s'", v)
			}
			h.WarnAt = f
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
		case "redis":
			if h.Redis != nil {
				return d.Err("redis given twice")
			}
			h.Redis = new(RedisConfig)
			if err := h.Redis.unmarshalCaddyfile(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized sliding_ratelimit subdirective '%s'", sub)
		}
	}
	if h.Limit == "" {
		return d.Err("sliding_ratelimit: limit is required")
	}
	if h.Window == 0 {
		return d.Err("sliding_ratelimit: window is required")
	}
	if err := h.checkAmounts(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// unmarshalCaddyfile reads `redis <url>` or a `redis { ... }` block.
func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		c.URL = d.Val()
		if _, err := redis.ParseURL(c.URL); err != nil {
			return d.Errf("redis: bad URL '%s': %v", c.URL, err)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
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
		case "sentinel":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c.Sentinel = v
		case "sentinel_password":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c.SentinelPassword = v
		case "tls":
			if c.TLS != nil {
				return d.Err("redis tls given twice")
			}
			c.TLS = new(RedisTLS)
			if err := c.TLS.unmarshalCaddyfile(d); err != nil {
				return err
			}
		case "username":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c.Username = v
		case "password":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c.Password = v
		case "db":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return d.Errf("redis db must be a non-negative integer, got '%s'", v)
			}
			c.DB = n
		case "pool_size":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("redis pool_size must be a positive integer, got '%s'", v)
			}
			c.PoolSize = n
		case "dial_timeout", "timeout":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("redis %s: bad duration '%s'", sub, v)
			}
			if sub == "timeout" {
				c.Timeout = caddy.Duration(dur)
			} else {
				c.DialTimeout = caddy.Duration(dur)
			}
		case "pipeline":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if v == "off" {
				c.Pipeline = -1
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 64 {
				return d.Errf("redis pipeline must be off or 1 to 64, got '%s'", v)
			}
			c.Pipeline = n
		case "key_prefix":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c.KeyPrefix = v
		default:
			return d.Errf("unrecognized sliding_ratelimit redis subdirective '%s'", sub)
		}
	}
	if err := c.validate(); err != nil {
		return d.Errf("redis: %v", err)
	}
	return nil
}

// unmarshalCaddyfile reads `tls`, `tls insecure_skip_verify` or a
// `tls { ca; cert; key; server_name; insecure_skip_verify }` block.
func (t *RedisTLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for d.NextArg() {
		if d.Val() != "insecure_skip_verify" {
			return d.Errf("redis tls: unknown option '%s'", d.Val())
		}
		t.InsecureSkipVerify = true
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
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
			return d.Errf("unrecognized sliding_ratelimit redis tls subdirective '%s'", sub)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return d.Err("redis tls: cert and key go together")
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
