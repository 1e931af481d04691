# The one test command (the README's, and what .ci/run runs): every test,
# with the race detector, in random order. Tests start their own
# redis-server processes (redis-server must be on PATH).
GO ?= go

.PHONY: test check vet fmt run build bench accuracy fuzz

test:
	$(GO) test -race -count=1 -shuffle=on -timeout 15m ./...

# check: formatting and vet, then the tests.
check: fmt vet test

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# run: Caddy with this plugin and the minimal example, no Redis needed.
run:
	$(GO) run ./cmd/caddy run --config examples/Caddyfile

build:
	$(GO) build -o caddy ./cmd/caddy
