#!/usr/bin/env bash
# profile-sites.sh: where each benchmark site's Caddy CPU goes, a request at
# a time, from CPU profiles of one Caddy in make bench's pinned layout (Caddy
# on CPU 0 with GOMAXPROCS=1; wrk -t1 -c64 and redis-server on CPU 1).
#
#   [PEER_SRC=<clone of mholt/caddy-ratelimit>] [CONNS=64] docs/profile-sites.sh [out-dir] [rounds]
#
# It builds and keeps make bench's Caddy and pinned Caddyfile (a -quick run of
# cmd/bench), then, round after round, loads each site for 14 s with wrk (CONNS
# connections, 64 by default, as make bench) and
# takes a 10 s CPU profile from s 2 through the admin endpoint. The table
# divides each profile's CPU (all of it, and the rows below) by the requests
# wrk counted in those 10 s (its rate x 10), in µs a request. Not a record of
# ratios: the profile itself costs Caddy a little, and the host's speed drifts
# between rounds (compare sites within a round). Traffic goes to 127.0.0.1
# only; every process it starts is stopped at the end. docs/bench.md explains
# the rows.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d /tmp/profile-sites.XXXXXX)}
rounds=${2:-2}
conns=${CONNS:-64}
mkdir -p "$out"
for t in wrk taskset curl redis-server; do
	command -v $t >/dev/null || { echo "profile-sites: $t is not on PATH" >&2; exit 1; }
done
sites=none,memory_log,redis_log,redis_counter,redis_fixed,redis_token,hot_denied
[ -n "${PEER_SRC:-}" ] && sites=none,memory_log,peer_memory,${sites#none,memory_log,}

echo "profile-sites: building Caddy (go run ./cmd/bench -quick -keep)" >&2
go run ./cmd/bench -keys 10000 -quick -keep -layouts pinned -harness bench -halfload=false -micro=false \
	-sites "$sites" >"$out/bench-quick.txt" 2>&1
dir=$(sed -n 's/^bench: keeping \(.*\)$/\1/p' "$out/bench-quick.txt" | head -1)
[ -d "$dir" ] || { echo "profile-sites: cmd/bench kept no directory (see $out/bench-quick.txt)" >&2; exit 1; }
cf=$dir/Caddyfile.bench-pinned
admin=$(sed -n 's/^\tadmin 127.0.0.1:\([0-9]*\)$/\1/p' "$cf")
rport=$(sed -n 's|.*redis redis://127.0.0.1:\([0-9]*\)$|\1|p' "$cf" | head -1)

pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
taskset -c 1 redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$out/redis.log" 2>&1 &
pids+=($!)
(cd "$dir" && GOMAXPROCS=1 exec taskset -c 0 ./caddy run --config "$cf" --adapter caddyfile) >"$out/caddy.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$admin/config/" && break; sleep 0.2; done

port() { grep -A1 "^# site $1\$" "$cf" | tail -1 | sed 's/.*:\([0-9]*\) {$/\1/'; }
for r in $(seq "$rounds"); do
	for s in ${sites//,/ }; do
		lua=$dir/wrk-keys.lua
		[ "$s" = hot_denied ] && lua=$dir/wrk-hot-hot_denied.lua
		taskset -c 1 wrk -t1 -c"$conns" -d14s -s "$lua" "http://127.0.0.1:$(port "$s")/" >"$out/wrk-$s-$r.txt" 2>&1 &
		w=$!
		sleep 2
		curl -s -o "$out/$s-$r.pprof" "http://127.0.0.1:$admin/debug/pprof/profile?seconds=10"
		wait "$w"
	done
done
stop
trap - EXIT

# µs a request: a function's cumulative CPU in the profile over wrk's requests in 10 s.
echo "Caddy CPU µs a request (pinned, wrk -t1 -c$conns, 10,000 keys), $(date -u '+%Y-%m-%d %H:%M UTC'):"
echo
echo "| site | round | req/s | all | the limiter's handler | the Redis worker | writing the response | reading the request | GC workers | mallocgc | header clone + sort |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for r in $(seq "$rounds"); do
	for s in ${sites//,/ }; do
		rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk-$s-$r.txt")
		go tool pprof -top -cum "$dir/caddy" "$out/$s-$r.pprof" 2>/dev/null |
			awk -v s="$s" -v r="$r" -v rps="$rps" '
			function secs(v) { if (v ~ /ms$/) { sub("ms", "", v); return v / 1000 } sub("s", "", v); return v + 0 }
			function u(name) { if (!(name in c)) return "–"; return sprintf("%.1f", c[name] * 1e6 / (rps * 10)) }
			/Total samples = / { t = $0; sub(/.*Total samples = /, "", t); sub(/ .*/, "", t); total = secs(t) }
			NF >= 6 && $4 ~ /s$/ { name = $6; for (i = 7; i <= NF; i++) name = name " " $i; c[name] = secs($4) }
			END {
				h = "github.com/sliding-ratelimit/sliding_ratelimit.(*Handler).ServeHTTP"
				if (!(h in c)) h = "github.com/mholt/caddy-ratelimit.Handler.ServeHTTP"
				hs = 0
				if ("net/http.Header.Clone (inline)" in c) hs += c["net/http.Header.Clone (inline)"]
				if ("net/http.Header.sortedKeyValues" in c) hs += c["net/http.Header.sortedKeyValues"]
				c["hs"] = hs
				printf "| `%s` | %s | %.0f | %.1f | %s | %s | %s | %s | %s | %s | %s |\n", s, r, rps, total * 1e6 / (rps * 10),
					u(h), u("github.com/sliding-ratelimit/sliding_ratelimit/limiter.(*worker).run"),
					u("net/http.(*response).finishRequest"), u("net/http.(*conn).readRequest"),
					u("runtime.gcBgMarkWorker"), u("runtime.mallocgc"), u("hs")
			}'
	done
done
echo
echo "profiles and wrk's output: $out; Caddy and its Caddyfile: $dir"
