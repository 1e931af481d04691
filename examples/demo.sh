#!/usr/bin/env bash
# The first five minutes, as a script: start Caddy with the minimal example
# (no Redis needed), watch the headers count down, get a 429 with
# Retry-After, wait that long, and get in again. CI runs it as a smoke test,
# and a test holds the README's copy of its output to it.
#
#   examples/demo.sh
#   CADDY=/path/to/caddy examples/demo.sh    # a Caddy already built, no go build
set -euo pipefail
cd "$(dirname "$0")/.."

tmp="$(mktemp -d)"
bin="${CADDY:-$tmp/caddy}"
log="$tmp/caddy.log"
[ -n "${CADDY:-}" ] || go build -o "$bin" ./cmd/caddy
"$bin" run --config examples/Caddyfile >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT

fail() { echo "demo: FAIL: $*" >&2; cat "$log" >&2; exit 1; }

# Wait for Caddy on its admin endpoint (a probe of :8080 would count), as
# long as it runs (a busy machine may take a while), at most a minute.
for i in $(seq 1 600); do
	curl -s -o /dev/null localhost:2019/config/ 2>/dev/null && break
	kill -0 "$pid" 2>/dev/null || fail "caddy exited"
	[ "$i" -lt 600 ] || fail "caddy did not answer on localhost:2019 within a minute"
	sleep 0.1
done

echo '$ for i in 1 2 3 4 5; do curl -s -D - -o /dev/null localhost:8080/ | grep -i ratelimit-remaining; done'
for want in 4 3 2 1 0; do
	line="$(curl -s -D - -o /dev/null localhost:8080/ | tr -d '\r' | grep -i '^x-ratelimit-remaining:')"
	echo "$line"
	[ "${line#*: }" = "$want" ] || fail "want X-RateLimit-Remaining $want"
done

echo
echo '$ curl -i localhost:8080/'
resp="$(curl -s -i localhost:8080/ | tr -d '\r')"
echo "$resp"
echo "$resp" | head -1 | grep -q ' 429' || fail "want 429"
retry="$(echo "$resp" | grep -i '^retry-after:' | awk '{print $2}')"
[ -n "$retry" ] && [ "$retry" -ge 1 ] || fail "want Retry-After >= 1"
echo "$resp" | grep -q '"error":"rate_limited"' || fail "want the JSON body"

echo
echo "\$ sleep $retry   # as Retry-After says"
sleep "$retry"
echo '$ curl -s -o /dev/null -w "%{http_code}\n" localhost:8080/'
code="$(curl -s -o /dev/null -w '%{http_code}' localhost:8080/)"
echo "$code"
[ "$code" = 200 ] || fail "want 200 after Retry-After"
echo
echo "demo: OK"
