#!/usr/bin/env bash
# Measures the times the README states for the first hour with this
# repository: each step once on a fresh machine state (a fresh clone, and new,
# empty GOPATH, GOMODCACHE and GOCACHE in a temp dir, so every module comes
# from the Go module proxy and everything compiles), then once more with the
# caches that run left (warm). Prints the README's table of measured times.
#
#   docs/first-hour.sh            # every step (make test twice: long)
#   docs/first-hour.sh build run  # some steps: build run xcaddy test
#
# It uses Caddy's admin port 2019 and the example's 8080 (the run step, and
# make test's TestReadmeRunCommand); beside another Caddy, move them:
#
#   ADMIN_PORT=2119 PORT=8180 docs/first-hour.sh   # make first-hour ADMIN_PORT=2119 PORT=8180
#
# The load average (1 minute) is taken as each run ends, and printed with
# the times: other jobs on the machine slow the runs down.
set -euo pipefail
ADMIN_PORT=${ADMIN_PORT:-2019} PORT=${PORT:-8080}
export RUN_ADMIN_PORT=$ADMIN_PORT RUN_PORT=$PORT
repo="$(cd "$(dirname "$0")/.." && pwd)"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build run xcaddy test)

secs() { printf '%.0f' "$(echo "$2 - $1" | bc)"; }
fmt() { # seconds -> "7 s", "2 min 31 s"
	local s=$1
	if [ "$s" -lt 60 ]; then echo "$s s"; else echo "$((s / 60)) min $((s % 60)) s"; fi
}
load() { cut -d' ' -f1 /proc/loadavg; }

# fresh DIR: a fresh clone in DIR/src with empty caches under DIR.
fresh() {
	export GOPATH="$1/gopath" GOCACHE="$1/gocache"
	unset GOMODCACHE
	git clone -q "$repo" "$1/src"
}

# timed CMD...: runs CMD in the clone, prints its seconds; fails loudly.
timed() {
	local start end
	start=$(date +%s.%N)
	if ! (cd "$dir/src" && "$@") >"$dir/log" 2>&1; then
		echo "first-hour: '$*' failed (its output: $dir/log):" >&2
		grep -- '--- FAIL' "$dir/log" >&2 || tail -30 "$dir/log" >&2
		exit 1
	fi
	end=$(date +%s.%N)
	secs "$start" "$end"
}

# serving: the README's run command, until Caddy's admin endpoint answers.
serving() {
	sed -i "s/^:8080 {/:$PORT {/; s/^\tadmin localhost:2019$/\tadmin localhost:$ADMIN_PORT/" examples/Caddyfile # the clone's copy
	go run ./cmd/caddy run --config examples/Caddyfile >"$dir/run.log" 2>&1 &
	local pid=$!
	for _ in $(seq 1 6000); do
		if curl -s -o /dev/null "localhost:$ADMIN_PORT/config/"; then
			pkill -P "$pid" 2>/dev/null || true
			kill "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || { cat "$dir/run.log"; return 1; }
		sleep 0.1
	done
	return 1
}

# rebuild: make build, without the ./caddy of a run before (go build skips a
# target that is up to date, which would measure nothing).
rebuild() {
	rm -f caddy
	make build
}

xcaddy_lines() {
	go install github.com/caddyserver/xcaddy/cmd/xcaddy@latest
	rm -f caddy
	"$(go env GOPATH)/bin/xcaddy" build --with github.com/sliding-ratelimit/sliding_ratelimit@v0.0.0=.
	./caddy list-modules | grep -q http.handlers.sliding_ratelimit
}

rows=()
loads=()
for step in "${steps[@]}"; do
	case $step in
	build) what='build: `make build`' cmd=(rebuild) ;;
	run) what='run: `go run ./cmd/caddy run --config examples/Caddyfile`, until it serves' cmd=(serving) ;;
	xcaddy) what='xcaddy: the install lines (`go install` xcaddy, `xcaddy build`)' cmd=(xcaddy_lines) ;;
	test) what='test: `make test`' cmd=(make test) ;;
	*) echo "unknown step $step (build, run, xcaddy, test)" >&2; exit 2 ;;
	esac
	dir="$(mktemp -d)"
	fresh "$dir"
	loads+=("$(load)")
	f=$(timed "${cmd[@]}")
	lf=$(load)
	w=$(timed "${cmd[@]}")
	lw=$(load)
	loads+=("$lf" "$lw")
	chmod -R u+w "$dir" && rm -rf "$dir"
	rows+=("| $what | $(fmt "$f") | $(fmt "$w") | $lf / $lw |")
	echo "${rows[-1]}" >&2 # progress
done

echo "| step | fresh machine | warm caches | load average at the end, fresh / warm |"
echo "| --- | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
echo
lo=$(printf '%s\n' "${loads[@]}" | sort -n | head -1)
hi=$(printf '%s\n' "${loads[@]}" | sort -n | tail -1)
echo "Measured by \`docs/first-hour.sh\` on $(date -u +%Y-%m-%d): $(nproc) vCPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem/{print $2}') GiB, $(go version | cut -d' ' -f3); load average $lo to $hi during the runs."
