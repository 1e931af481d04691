package slidingratelimit

import (
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestReadmeProductionEnvironment: with UPSTREAM and REDIS_URL unset, the
// production example proxies to 127.0.0.1:9000 (502 until something
// listens there) and writes into the Redis on 127.0.0.1:6379; the README
// says both next to the example.
func TestReadmeProductionEnvironment(t *testing.T) {
	for _, v := range []string{"UPSTREAM", "REDIS_URL"} {
		if os.Getenv(v) != "" {
			t.Skipf("%s is set in this environment: the example's defaults are not in play", v)
		}
	}
	src, err := os.ReadFile("examples/production.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "examples/production.Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"dial":"127.0.0.1:9000"`, `"url":"redis://127.0.0.1:6379"`} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the production example, adapted with an empty environment, has no %s:\n%s", want, out)
		}
	}
	prod := readmeSection(t, "The typical production config")
	_, after, _ := strings.Cut(prod, "\n```\n")
	para := strings.Join(strings.Fields(after), " ")
	for _, want := range []string{"`UPSTREAM` is 127.0.0.1:9000, so every request that passes gets 502 until your application listens there",
		"`REDIS_URL` is 127.0.0.1:6379, so the keys go into whatever Redis listens on loopback"} {
		if !strings.Contains(para, want) {
			t.Errorf("README, after the production example, does not say %q:\n%s", want, para)
		}
	}
	install := strings.Join(strings.Fields(readmeSection(t, "Install")), " ")
	if want := "xcaddy builds with other flags (`-trimpath`), so its first build compiles all of Caddy again even after `make build`"; !strings.Contains(install, want) {
		t.Errorf("README, Install, does not say %q", want)
	}
}
