// Command caddy is Caddy with its standard modules and the sliding_ratelimit
// plugin compiled in. It is what the README's run command and the end-to-end
// benchmark start:
//
//	go run ./cmd/caddy run --config examples/Caddyfile
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// This plugin.
	_ "github.com/sliding-ratelimit/sliding_ratelimit"
)

func main() {
	caddycmd.Main()
}
