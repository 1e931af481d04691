package main

import (
	"fmt"
	"strings"
)

// manyKeysLimit admits every request: the many-key sites measure the cost of
// checking and recording, never a denial.
const manyKeysLimit = "1000000000"

// manyKeysLogLimit is the many-key sliding_log sites' limit: the most
// entries a log may hold per key (the engine rejects more). Spread over
// -keys keys, no key comes near it, so every request is admitted too.
const manyKeysLogLimit = "10000"

// bareSite is the name of the site without a limiter: every other site is
// measured in pairs with it.
const bareSite = "none"

// fillKeys is how many keys the at-limit sites (Fill) spread their traffic
// over: few, so each key sees enough traffic to hold a set of its limit.
const fillKeys = 10

// site is one Caddy site of the benchmark.
type site struct {
	Name string
	// Desc says what the site measures, for the report.
	Desc string
	// Hot sends every request with one X-Key (a key over its limit);
	// otherwise each request picks a random key from the pool.
	Hot bool
	// Keys, when > 0, replaces -keys as the size of the key pool.
	Keys int
	// Fill drives the site until its keys are at their limit (most
	// responses 429) before it is measured, so sliding_log's sets hold
	// about limit entries each.
	Fill bool
	// Redis: the limiter uses the benchmark's redis-server.
	Redis bool
	// Limiter is the sliding_ratelimit block body, one subdirective a line,
	// with %REDIS% for the Redis URL; empty means no limiter.
	Limiter []string
	// Peer: the limiter is mholt/caddy-ratelimit's rate_limit (Limiter is
	// its block body), so the site runs only when -peer gives its source.
	Peer bool
	// Needs says which feature the site depends on, for error messages.
	Needs string
}

// directive is the site's limiter directive.
func (s site) directive() string {
	if s.Peer {
		return "rate_limit"
	}
	return "sliding_ratelimit"
}

// allSites is every site, in the order they run and print.
var allSites = []site{
	{Name: bareSite, Desc: "Caddy without a limiter, paired with itself: the noise floor"},
	{Name: "memory_log", Desc: "in-process sliding_log, many keys", Limiter: manyKeys("bench_memory_log", "sliding_log", false)},
	{Name: "memory_log_noheaders", Desc: "as memory_log with `headers off` (the peer sends no headers on success)",
		Limiter: append(manyKeys("bench_memory_log_noheaders", "sliding_log", false), "headers off")},
	{Name: "peer_memory", Desc: "the peer, mholt/caddy-ratelimit: its in-process sliding window, many keys, limit 100 a second (with -peer)",
		Peer: true, Limiter: peerZone("bench_peer", 100, "1s")},
	{Name: "redis_log", Desc: "Redis sliding_log, many keys (sets of a few entries), pipelined",
		Redis: true, Limiter: manyKeys("bench_redis_log", "sliding_log", true)},
	{Name: "redis_log_nopipe", Desc: "as redis_log with `pipeline off`", Redis: true, Needs: "redis { pipeline off }",
		Limiter: append(manyKeys("bench_redis_log_nopipe", "sliding_log", false), "redis %REDIS% {", "pipeline off", "}")},
	{Name: "redis_log_eval", Desc: "as redis_log with `redis { scripts eval }`: EVALSHA, as on Redis 5 and 6, instead of the function library",
		Redis: true, Needs: "redis { scripts eval }",
		Limiter: append(manyKeys("bench_redis_log_eval", "sliding_log", false), "redis %REDIS% {", "scripts eval", "}")},
	{Name: "redis_log_100", Desc: "Redis sliding_log, limit 100: 10 keys held at their limit (sets of 100), deny cache off",
		Redis: true, Keys: fillKeys, Fill: true, Limiter: atLimit("bench_redis_log_100", 100), Needs: "subdirective deny_cache off"},
	{Name: "redis_log_10000", Desc: "Redis sliding_log, limit 10000: 10 keys held at their limit (sets of 10000), deny cache off",
		Redis: true, Keys: fillKeys, Fill: true, Limiter: atLimit("bench_redis_log_10000", 10000), Needs: "subdirective deny_cache off"},
	{Name: "redis_counter", Desc: "Redis sliding_counter, many keys", Redis: true,
		Limiter: manyKeys("bench_redis_counter", "sliding_counter", true), Needs: "algorithm sliding_counter"},
	{Name: "redis_fixed", Desc: "Redis fixed_window, many keys", Redis: true,
		Limiter: manyKeys("bench_redis_fixed", "fixed_window", true), Needs: "algorithm fixed_window"},
	{Name: "redis_token", Desc: "Redis token_bucket, many keys", Redis: true,
		Limiter: manyKeys("bench_redis_token", "token_bucket", true), Needs: "algorithm token_bucket"},
	{Name: "hot_denied", Desc: "one key over its limit, deny cache on", Hot: true, Redis: true,
		Limiter: hotKey("bench_hot_denied", false), Needs: "the deny cache (on by default)"},
	{Name: "hot_denied_nocache", Desc: "one key over its limit, `deny_cache off`", Hot: true, Redis: true,
		Limiter: hotKey("bench_hot_denied_nocache", true), Needs: "subdirective deny_cache off"},
}

// atLimit is a Redis sliding_log whose few keys are kept at their limit
// (see Fill), without the deny cache, so every request runs the script
// against a set of about limit entries.
func atLimit(name string, limit int) []string {
	return []string{
		"name " + name,
		"algorithm sliding_log",
		"key {http.request.header.X-Key}",
		fmt.Sprintf("limit %d", limit),
		"window 1m",
		"redis %REDIS%",
		"deny_cache off",
	}
}

func manyKeys(name, algorithm string, onRedis bool) []string {
	limit := manyKeysLimit
	if algorithm == "sliding_log" {
		limit = manyKeysLogLimit
	}
	l := []string{
		"name " + name,
		"algorithm " + algorithm,
		"key {http.request.header.X-Key}",
		"limit " + limit,
		"window 1m",
	}
	if onRedis {
		l = append(l, "redis %REDIS%")
	}
	return l
}

// peerZone is a rate_limit block of one zone keyed like the many-key
// sites. The peer keeps a ring of events timestamps per key, so its limit
// stays small (100 a second, as in the layout); spread over -keys
// keys, no key comes near it either.
func peerZone(name string, events int, window string) []string {
	return []string{
		"zone " + name + " {",
		"key {http.request.header.X-Key}",
		fmt.Sprintf("events %d", events),
		"window " + window,
		"}",
	}
}

func hotKey(name string, noCache bool) []string {
	l := []string{
		"name " + name,
		"algorithm sliding_log",
		"key {http.request.header.X-Key}",
		"limit 10",
		"window 1h",
		"redis %REDIS%",
	}
	if noCache {
		l = append(l, "deny_cache off")
	}
	return l
}

// hotKeyFor is the one X-Key sent to a hot site.
func hotKeyFor(s site) string { return "hot-" + s.Name }

// siteByName returns the site of that name (the zero site if none).
func siteByName(name string) site {
	for _, s := range allSites {
		if s.Name == name {
			return s
		}
	}
	return site{}
}

// siteNames lists the known site names.
func siteNames() []string {
	names := make([]string, len(allSites))
	for i, s := range allSites {
		names[i] = s.Name
	}
	return names
}

// selectSites parses the -sites flag: a comma-separated list of names, or
// "all". The result keeps the canonical order. The peer's sites need peer
// (-peer given): "all" leaves them out without it, naming one is an error.
func selectSites(flagVal string, peer bool) ([]site, error) {
	flagVal = strings.TrimSpace(flagVal)
	if flagVal == "" || flagVal == "all" {
		var out []site
		for _, s := range allSites {
			if peer || !s.Peer {
				out = append(out, s)
			}
		}
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(flagVal, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		s := siteByName(n)
		if s.Name == "" {
			return nil, fmt.Errorf("unknown site %q in -sites (known: %s)", n, strings.Join(siteNames(), ","))
		}
		if s.Peer && !peer {
			return nil, fmt.Errorf("site %q is mholt/caddy-ratelimit's: give its source with -peer DIR (or PEER_SRC=DIR)", n)
		}
		want[n] = true
	}
	var out []site
	for _, s := range allSites {
		if want[s.Name] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-sites selects no site (known: %s)", strings.Join(siteNames(), ","))
	}
	return out, nil
}

// caddyfile renders the benchmark Caddyfile: global options, then one site
// per entry of sites, each on its own loopback port.
func caddyfile(adminPort int, sites []site, ports map[string]int, redisURL string) string {
	return caddyfileFor(harness{Name: "bench", Admin: true}, adminPort, sites, ports, redisURL)
}

// caddyfileFor is caddyfile in harness setting h: the admin endpoint on
// adminPort or off, Caddy's default log level, our many-key limiters' rate.
func caddyfileFor(h harness, adminPort int, sites []site, ports map[string]int, redisURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by go run ./cmd/bench: one site per benchmark case (harness %s).\n{\n", h.Name)
	if h.Admin {
		fmt.Fprintf(&b, "\tadmin 127.0.0.1:%d\n", adminPort)
	} else {
		b.WriteString("\tadmin off\n")
	}
	if h.LogLevel != "" {
		fmt.Fprintf(&b, "\tlog {\n\t\tlevel %s\n\t}\n", h.LogLevel)
	}
	b.WriteString("\tauto_https off\n\tpersist_config off\n\tgrace_period 1s\n}\n")
	for _, s := range sites {
		s = s.withRate(h.Rate)
		fmt.Fprintf(&b, "\n# site %s\nhttp://127.0.0.1:%d {\n\tbind 127.0.0.1\n", s.Name, ports[s.Name])
		if len(s.Limiter) > 0 {
			fmt.Fprintf(&b, "\t%s {\n", s.directive())
			for _, line := range s.Limiter {
				fmt.Fprintf(&b, "\t\t%s\n", strings.ReplaceAll(line, "%REDIS%", redisURL))
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("\trespond \"ok\" 200\n}\n")
	}
	return b.String()
}
