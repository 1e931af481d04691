# The one test command (the README's, and what .ci/run runs): first the
# tools the tests need (.ci/deps installs what is missing, or names the one
# command that does), gofmt and go vet; then every test, with the race
# detector, in random order. Tests start their own redis-server processes.
# They run with a temporary directory of their own (TMPDIR), which must be
# empty when they end: a test that leaves a file, a socket or a server's
# directory behind fails make test.
GO ?= go

.PHONY: test deps check vet fmt run build xcaddy first-hour bench accuracy fuzz simulate multidc

test: deps fmt vet
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	echo "TMPDIR=$$tmp $(GO) test -race -count=1 -shuffle=on -timeout 15m ./..." && \
	TMPDIR=$$tmp $(GO) test -race -count=1 -shuffle=on -timeout 15m ./... && \
	if [ -n "$$(ls -A "$$tmp")" ]; then \
		echo "make test: the tests left this in their temporary directory:"; find "$$tmp" -mindepth 1 | head -50; exit 1; \
	fi

# deps: redis-server, redis-cli, curl and promtool (Debian packages, as root);
# then Redis 6.0.16 unpacked into .cache/redis6 (.ci/redis6: once, about
# 2.5 MB, no root needed), for the tests of the Redis 5/6 path.
deps:
	@.ci/deps
	@.ci/redis6

# check: the same as test (which runs gofmt and go vet first), kept as a name.
check: test

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# run: Caddy with this plugin and the minimal example, no Redis needed.
run:
	$(GO) run ./cmd/caddy run --config examples/Caddyfile

# build: ./caddy, Caddy's standard modules and this plugin (cmd/caddy).
build:
	$(GO) build -o caddy ./cmd/caddy

# xcaddy: ./caddy built by xcaddy from this checkout, as the README's install
# section does, with the Caddy version of go.mod; then its modules.
XCADDY ?= $(GO) run github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
xcaddy:
	$(XCADDY) build $$($(GO) list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2) \
		--output ./caddy --with github.com/sliding-ratelimit/sliding_ratelimit@v0.0.0=.
	./caddy list-modules | grep sliding_ratelimit

# first-hour: measure the README's times (fresh caches, then warm); long.
# Its output is the record docs/first-hour.txt, which the README quotes.
# Beside another Caddy: make first-hour ADMIN_PORT=2119 PORT=8180.
first-hour:
	docs/first-hour.sh >docs/first-hour.txt.new && mv docs/first-hour.txt.new docs/first-hour.txt && cat docs/first-hour.txt

# bench: the end-to-end benchmark (builds Caddy, starts its own redis-server,
# prints req/s, p50, p99 and each site's ratio to Caddy without a limiter),
# 10,000 keys as in issue #22's layout, in both harness settings (its own,
# and issue 29's outside one: pinned, 32 connections, admin off, ERROR logs). PEER_SRC=<a clone of
# mholt/caddy-ratelimit> measures the peer in the same run; docs/bench.png
# draws the ratios. Then cmd/rlsbench: cmd/rls (Envoy's rate limit service)
# beside envoyproxy/ratelimit on one redis-server of its own, the same
# fixed-window descriptor config (ours also sliding_log), checks/s, p50 and
# p99 per check and the ratios, at 1x8 and 4x64 gRPC connections x checks
# in flight. ENVOY_RLS=<a clone of envoyproxy/ratelimit (built with go build)
# or its binary> measures it; without it, ours alone, and the run says so.
# Last, cmd/scriptcost -redis_rate: Redis CPU per check of ours (sliding_log,
# then token_bucket), the original four-command script and
# go-redis/redis_rate's GCRA, in turns on one redis-server of its own.
bench:
	$(GO) run ./cmd/bench -keys 10000 -plot docs/bench.png
	$(GO) run ./cmd/rlsbench -keys 10000
	$(GO) run ./cmd/scriptcost -kind 1 -redis_rate
	$(GO) run ./cmd/scriptcost -kind 4 -redis_rate

# accuracy: sliding_counter against the exact sliding_log on a 1M-request trace.
# Its output is the record docs/accuracy.txt, which docs/testing.md quotes.
accuracy:
	$(GO) run ./cmd/accuracy >docs/accuracy.txt.new && mv docs/accuracy.txt.new docs/accuracy.txt && cat docs/accuracy.txt

# multidc: the global ceiling across data centres (issue #28): a sweep of
# 2 and 8 data centres x ceilings of 10 to 100,000 a window x the ledger 10
# to 250 ms away, each cell a viral trace with a fault, about 5 minutes (CPU
# heavy: 9 redis-servers and 8 nodes at most). Its output is the record
# docs/multidc.txt; docs/multidc.png draws the ceiling used by cell.
# `go run ./cmd/multidc` alone runs issue #21's 8-data-centre viral trace.
multidc:
	$(GO) run ./cmd/multidc -sweep -plot docs/multidc.png >docs/multidc.txt.new && mv docs/multidc.txt.new docs/multidc.txt && cat docs/multidc.txt

# fuzz: run each fuzz target for FUZZTIME (the seed corpora run in make test).
FUZZTIME ?= 10m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(FUZZTIME) ./limiter/
	$(GO) test -run '^$$' -fuzz '^FuzzReadReplies$$' -fuzztime $(FUZZTIME) ./limiter/
	$(GO) test -run '^$$' -fuzz '^FuzzCaddyfile$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzHostileHeaders$$' -fuzztime $(FUZZTIME) .

# simulate: the simulation (limiter/sim*_test.go) of random histories against
# the oracle, on the in-process store and on a real redis-server, for
# SIM_TIME per stack (make test runs a fixed budget of it); then the one with
# data centres (limiter/simdc*_test.go, TestSimDC) for SIM_TIME more. A
# failing seed prints its shrunk history for TestSimReplay; SIM_SEED=<n>
# replays one (with -run TestSimDC for the data centres').
SIM_TIME ?= 10m
simulate:
	SIM_TIME=$(SIM_TIME) $(GO) test -race -count=1 -timeout 0 -v -run '^TestSim(Memory|Redis|DC)$$' ./limiter/
