package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/adapt/*.json from the examples")

// exampleFiles lists every Caddyfile under examples/.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("examples/*Caddyfile")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	return files
}

func goldenPath(example string) string {
	name := strings.TrimSuffix(filepath.Base(example), ".Caddyfile")
	if name == "Caddyfile" {
		name = "minimal"
	}
	return filepath.Join("testdata", "adapt", name+".json")
}

func adapt(t *testing.T, src []byte) []byte {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return pretty.Bytes()
}

// TestExamplesAdapt adapts every example to its golden JSON and validates
// the result as Caddy would load it (modules provisioned, nothing started).
func TestExamplesAdapt(t *testing.T) {
	for _, ex := range exampleFiles(t) {
		t.Run(filepath.Base(ex), func(t *testing.T) {
			src, err := os.ReadFile(ex)
			if err != nil {
				t.Fatal(err)
			}
			golden := goldenPath(ex)
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, adapt(t, src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("golden file: %v (run go test -run TestExamplesAdapt -update)", err)
			}
			caddytest.AssertAdapt(t, string(src), "caddyfile", string(want))

			var cfg caddy.Config
			if err := json.Unmarshal(adapt(t, src), &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Fatalf("adapted example does not load: %v", err)
			}
		})
	}
}

// TestExamplesValidateWithEmptyEnvironment runs this repo's Caddy as a user
// would, `caddy validate --config <example>`, with an empty environment:
// every example loads without a password or any variable set.
func TestExamplesValidateWithEmptyEnvironment(t *testing.T) {
	bin := buildCaddy(t)
	for _, ex := range exampleFiles(t) {
		cmd := exec.Command(bin, "validate", "--config", ex, "--adapter", "caddyfile")
		cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("caddy validate --config %s with an empty environment: %v\n%s", ex, err, out)
		}
	}
}

// buildCaddy builds ./cmd/caddy once per test binary (the go build cache
// makes it quick after the first time).
func buildCaddy(t *testing.T) string {
	t.Helper()
	caddyBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "sliding-ratelimit-caddy-")
		if err != nil {
			caddyBuild.err = err
			return
		}
		caddyBuild.dir = dir
		caddyBuild.bin = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", caddyBuild.bin, "./cmd/caddy").CombinedOutput()
		if err != nil {
			caddyBuild.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if caddyBuild.err != nil {
		t.Fatal(caddyBuild.err)
	}
	return caddyBuild.bin
}

var caddyBuild struct {
	once     sync.Once
	dir, bin string
	err      error
}

// TestBadCaddyfiles: every bad value is refused when the config loads, with
// a message naming the problem.
func TestBadCaddyfiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body, want string
	}{
		{"unknown subdirective", "limit 5\nwindow 1m\nburstiness 3", "unrecognized sliding_ratelimit subdirective 'burstiness'"},
		{"limit 0", "limit 0\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got '0'"},
		{"negative limit", "limit -3\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got '-3'"},
		{"limit not a number", "limit lots\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got 'lots'"},
		{"limit above 2^50", "limit 9007199254740993\nwindow 1m", "limit must be a positive integer (at most 2^50)"},
		{"missing limit", "window 1m", "limit is required"},
		{"missing window", "limit 5", "limit 5 has no window: set window, or give it one (limit 5 1m)"},
		{"bad duration", "limit 5\nwindow soon", "window: bad duration 'soon'"},
		{"window below 1ms", "limit 5\nwindow 100us", "window must be at least 1ms, got 100µs"},
		{"unknown fail mode", "limit 5\nwindow 1m\nfail sideways", "fail must be open, closed or local, got 'sideways'"},
		{"unknown clock", "limit 5\nwindow 1m\nclock ntp", "clock must be redis or app, got 'ntp'"},
		{"unknown headers", "limit 5\nwindow 1m\nheaders some", "headers must be both, ietf, legacy or off, got 'some'"},
		{"unknown algorithm", "limit 5\nwindow 1m\nalgorithm leaky_bucket", "unknown algorithm 'leaky_bucket'"},
		{"bad name", "name a:b\nlimit 5\nwindow 1m", "limiter name \"a:b\" may hold only"},
		{"bad redis URL", "limit 5\nwindow 1m\nredis http://localhost:6379", "redis: bad URL 'http://localhost:6379'"},
		{"redis URL and address", "limit 5\nwindow 1m\nredis redis://localhost:6379 {\naddress localhost:6380\n}", "either a URL or addresses"},
		{"redis without address", "limit 5\nwindow 1m\nredis {\ntimeout 1s\n}", "redis: needs a URL or an address"},
		{"redis bad timeout", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\ntimeout forever\n}", "redis timeout: bad duration 'forever'"},
		{"redis bad db", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\ndb x\n}", "redis db must be a non-negative integer, got 'x'"},
		{"redis unknown subdirective", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\nreplicas 2\n}", "unrecognized sliding_ratelimit redis subdirective 'replicas'"},
		{"key prefix with brace", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\nkey_prefix a{b\n}", "key_prefix 'a{b' must not contain"},
		{"redis bad pipeline", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\npipeline 0\n}", "redis pipeline must be off or 1 to 64, got '0'"},
		{"limit with a bad window", "limit 5 6\nwindow 1m", "limit: bad window '6'"},
		{"limit with three values", "limit 5 1m 6", "limit takes a limit and an optional window"},
		{"key without value", "key\nlimit 5\nwindow 1m", "key needs a value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := ":8080 {\n\tsliding_ratelimit {\n" + tc.body + "\n\t}\n\trespond ok\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
			if err == nil {
				t.Fatalf("adapted without error; want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:") {
				t.Errorf("error %q does not name the file and line", err)
			}
		})
	}
}

// TestBadJSON: the same checks hold for JSON configs, in Validate.
func TestBadJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		h    Handler
		want string
	}{
		{"no limit", Handler{Window: caddy.Duration(time.Minute)}, "limit is required"},
		{"limit 0", Handler{Limit: "0", Window: caddy.Duration(time.Minute)}, "limit must be a positive integer"},
		{"global without region", Handler{Limit: "5", GlobalLimit: "7", Window: caddy.Duration(time.Minute)}, "global_limit needs region"},
		{"cost above limit", Handler{Limit: "5", Cost: "6", Window: caddy.Duration(time.Minute)}, "cost 6 is above limit 5"},
		{"no window", Handler{Limit: "3"}, "limit 3 has no window"},
		{"fail", Handler{Limit: "3", Window: caddy.Duration(time.Minute), Fail: "maybe"}, "fail must be open, closed or local"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := tc.h.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestUnmarshalCaddyfileFull(t *testing.T) {
	t.Parallel()
	d := caddyfile.NewTestDispenser(`sliding_ratelimit {
		name       api
		algorithm  sliding_log
		key        {http.request.header.X-API-Key}
		region     {http.request.header.X-Region}
		limit      100
		window     1m
		fail       closed
		clock      app
		headers    ietf
		redis {
			address      10.0.0.1:6379
			username     limiter
			password     pw
			db           2
			dial_timeout 300ms
			timeout      40ms
			pool_size    64
			pipeline     4
			key_prefix   rl:
		}
	}`)
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	want := Handler{
		Name: "api", Algorithm: "sliding_log", Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "100", Window: caddy.Duration(time.Minute), Fail: "closed", Clock: "app", Headers: "ietf",
		Redis: &RedisConfig{Addresses: []string{"10.0.0.1:6379"}, Username: "limiter", Password: "pw", DB: 2,
			DialTimeout: caddy.Duration(300 * time.Millisecond), Timeout: caddy.Duration(40 * time.Millisecond), PoolSize: 64, Pipeline: 4, KeyPrefix: "rl:"},
	}
	got, _ := json.Marshal(h)
	exp, _ := json.Marshal(want)
	if !bytes.Equal(got, exp) {
		t.Fatalf("got  %s\nwant %s", got, exp)
	}

	d = caddyfile.NewTestDispenser("sliding_ratelimit {\nlimit 1\nwindow 1s\nredis rediss://u:p@redis.example:6380/3\n}")
	h = Handler{}
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if h.Redis == nil || h.Redis.URL != "rediss://u:p@redis.example:6380/3" {
		t.Fatalf("redis URL not kept: %+v", h.Redis)
	}
	opts, err := h.Redis.options()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Addrs[0] != "redis.example:6380" || opts.DB != 3 || opts.Username != "u" || opts.Password != "p" || opts.TLSConfig == nil {
		t.Fatalf("URL options: %+v", opts)
	}
	if opts.MaxRetries != -1 || opts.ReadTimeout != DefaultTimeout || opts.DialTimeout != DefaultDialTimeout {
		t.Fatalf("timeouts/retries not bounded: retries %d read %s dial %s", opts.MaxRetries, opts.ReadTimeout, opts.DialTimeout)
	}
}
