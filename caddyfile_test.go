package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	// The goldens are the examples' defaults: an environment variable of
	// the shell running the tests must not change what they adapt to.
	for _, v := range exampleEnv {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
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
			if err := validateConfig(&cfg); err != nil {
				t.Fatalf("adapted example does not load: %v", err)
			}
		})
	}
}

// exampleEnv are the environment variables the examples read when adapted
// ({$VAR:default}), each with a loopback default.
var exampleEnv = []string{"REDIS_URL", "REDIS_CLUSTER", "UPSTREAM", "LEDGER_URL", "DATACENTER", "PORT", "ADMIN", "REGION_LIMIT", "GLOBAL_LIMIT"}

// TestExamplesValidateWithEmptyEnvironment runs this repo's Caddy as a user
// would, `caddy validate --config <example>`, with an empty environment:
// every example loads without a password or any variable set. And it dials
// nothing but loopback: `caddy adapt`, in the same environment, gives every
// Redis address of every example on a loopback address.
func TestExamplesValidateWithEmptyEnvironment(t *testing.T) {
	bin := buildCaddy(t)
	env := []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	dead := deadLoopbackAddr(t)
	for _, ex := range exampleFiles(t) {
		// validate provisions, and so dials the examples' loopback Redis
		// defaults: it runs on a copy with each of them moved to an address
		// nothing listens on (a Redis that does not answer is a warning), so
		// that no test reaches a Redis it did not start (the machine's 6379).
		cmd := exec.Command(bin, "validate", "--config", loopbackRedisMoved(t, ex, dead), "--adapter", "caddyfile")
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("caddy validate --config %s with an empty environment: %v\n%s", ex, err, out)
		}
		cmd = exec.Command(bin, "adapt", "--config", ex, "--adapter", "caddyfile")
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("caddy adapt --config %s with an empty environment: %v\n%s", ex, err, out)
			continue
		}
		addrs, err := redisAddresses(out)
		if err != nil {
			t.Errorf("%s: %v", ex, err)
			continue
		}
		src, err := os.ReadFile(ex)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(src, []byte("redis")) && len(addrs) == 0 {
			t.Errorf("%s names Redis, but no Redis address was found in its adapted JSON", ex)
		}
		for _, a := range addrs {
			if !isLoopback(a) {
				t.Errorf("%s dials %s with an empty environment: an example's addresses take a loopback default ({$REDIS_URL:redis://127.0.0.1:6379})", ex, a)
			}
		}
	}
}

// deadLoopbackAddr is a loopback address nothing listens on (a port the
// test took and let go).
func deadLoopbackAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// loopbackAddrRE is a 127.0.0.1 address with its port.
var loopbackAddrRE = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

// loopbackRedisMoved writes a copy of the example ex, beside nothing of the
// repository, whose every 127.0.0.1 address on a redis, global_redis or
// address line is dead, and returns its path.
func loopbackRedisMoved(t *testing.T, ex, dead string) string {
	src, err := os.ReadFile(ex)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "redis" || f[0] == "global_redis" || f[0] == "address") {
			lines[i] = loopbackAddrRE.ReplaceAllString(l, dead)
		}
	}
	out := filepath.Join(t.TempDir(), filepath.Base(ex))
	if err := os.WriteFile(out, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// redisAddresses returns the Redis URL and addresses (redis and
// global_redis) of every sliding_ratelimit handler in an adapted config,
// wherever it sits.
func redisAddresses(config []byte) ([]string, error) {
	var v any
	if err := json.Unmarshal(config, &v); err != nil {
		return nil, err
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for _, field := range []string{"redis", "global_redis"} {
				if r, ok := v[field].(map[string]any); ok && v["handler"] == "sliding_ratelimit" {
					if u, ok := r["url"].(string); ok {
						out = append(out, u)
					}
					out = append(out, asStrings(r["addresses"])...)
				}
			}
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return out, nil
}

func asStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// isLoopback: a redis:// URL or a host:port whose host is localhost or a
// loopback IP.
func isLoopback(addr string) bool {
	hostport := addr
	if u, err := url.Parse(addr); err == nil && u.Scheme != "" && u.Host != "" {
		hostport = u.Host
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TestIsLoopback: the check above tells loopback from the rest.
func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"redis://127.0.0.1:6379": true, "rediss://user:pw@localhost:6380/2": true, "127.0.0.1:7000": true,
		"[::1]:6379": true, "redis://[::1]:6379": true,
		"10.0.0.11:6379": false, "redis://10.0.0.11:6379": false, "redis.internal:6379": false,
		"rediss://ratelimit:secret@redis.internal:6380": false, "192.168.1.5:26379": false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
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
	// The line marked @ is the one the error must point at; without one,
	// the sliding_ratelimit line (line 2: something is missing).
	cases := []struct {
		name, body, want string
	}{
		{"unknown subdirective", "limit 5\nwindow 1m\n@burstiness 3", "unrecognized sliding_ratelimit subdirective 'burstiness'"},
		{"limit 0", "@limit 0\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got '0'"},
		{"negative limit", "@limit -3\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got '-3'"},
		{"limit not a number", "@limit lots\nwindow 1m", "limit must be a positive integer (at most 2^50) or a placeholder, got 'lots'"},
		{"limit above 2^50", "@limit 9007199254740993\nwindow 1m", "limit must be a positive integer (at most 2^50)"},
		{"missing limit", "window 1m", "limit is required"},
		{"missing window", "name x\n@limit 5", "limit 5 has no window: set window, or give it one (limit 5 1m)"},
		{"bad duration", "limit 5\n@window soon", "window: bad duration 'soon'"},
		{"window below 1ms", "limit 5\n@window 100us", "window must be at least 1ms, got 100µs"},
		{"window 0", "limit 5\n@window 0", "window must be at least 1ms, got 0s"},
		{"window 0s", "name x\nlimit 5\n@window 0s", "window must be at least 1ms, got 0s"},
		{"limit with window 0s", "@limit 10 0s", "limit 10 0s: window must be at least 1ms, got 0s"},
		{"global_limit with window 0", "region {header.X-Region}\nlimit 5 1m\n@global_limit 10 0", "global_limit 10 0: window must be at least 1ms, got 0s"},
		{"unknown fail mode", "limit 5\nwindow 1m\n@fail sideways", "fail must be open, closed or local, got 'sideways'"},
		{"unknown clock", "limit 5\nwindow 1m\n@clock ntp", "clock must be redis or app, got 'ntp'"},
		{"unknown headers", "limit 5\nwindow 1m\n@headers some", "headers must be both, ietf, legacy or off, got 'some'"},
		{"unknown algorithm", "limit 5\nwindow 1m\n@algorithm leaky_bucket", "unknown algorithm 'leaky_bucket'"},
		{"bad name", "@name a:b\nlimit 5\nwindow 1m", "limiter name \"a:b\" may hold only"},
		{"bad redis URL", "limit 5\nwindow 1m\n@redis http://localhost:6379", "redis: bad URL 'http://localhost:6379'"},
		{"redis URL without a scheme", "limit 5\nwindow 1m\n@redis localhost:6379", "it needs a scheme: write redis://localhost:6379 (or rediss:// for TLS)"},
		{"redis URL and address", "limit 5\nwindow 1m\nredis redis://localhost:6379 {\n@address localhost:6380\n}", "either a URL or addresses"},
		{"redis without address", "limit 5\nwindow 1m\n@redis {\ntimeout 1s\n}", "redis: needs a URL or an address"},
		{"redis bad timeout", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@timeout forever\n}", "redis timeout: bad duration 'forever'"},
		{"redis bad db", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@db x\n}", "redis db must be a non-negative integer, got 'x'"},
		{"redis unknown subdirective", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@replicas 2\n}", "unrecognized sliding_ratelimit redis subdirective 'replicas'"},
		{"key prefix with brace", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@key_prefix a{b\n}", "key_prefix 'a{b' must not contain"},
		{"redis bad pipeline", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@pipeline 0\n}", "redis pipeline must be off or 1 to 64, got '0'"},
		{"redis bad scripts", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@scripts evalsha\n}", "scripts must be functions or eval, got 'evalsha'"},
		{"redis option twice", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\ntimeout 1s\n@timeout 2s\n}", "redis timeout given twice"},
		{"limit with a bad window", "@limit 5 6\nwindow 1m", "limit: bad window '6'"},
		{"limit with three values", "@limit 5 1m 6", "limit takes a limit and an optional window"},
		{"key without value", "@key\nlimit 5\nwindow 1m", "key needs a value"},
		{"key given twice", "key {client_ip}\n@key {http.request.header.X-Key}\nlimit 5\nwindow 1m", "key given twice"},
		{"limit without window twice", "limit 5\n@limit 6\nwindow 1m", "limit 6 given twice without a window"},
		{"one window twice", "limit 5 1m\n@limit 6 1m", "two limit lines with the window 1m"},
		{"cost above the limit", "limit 5\nwindow 1m\n@cost 6", "cost 6 is above limit 5"},
		{"sliding_log above its entries", "@limit 20000\nwindow 1m", "limit 20000 on sliding_log: the log keeps one entry per request"},
		{"burst without token_bucket", "limit 5\nwindow 1m\n@burst 9", "burst is the capacity of algorithm token_bucket"},
		{"burst with two windows", "algorithm token_bucket\nlimit 5 1s\nlimit 50 1m\n@burst 9", "burst needs exactly one duration window"},
		{"algorithm of calendar periods only", "@algorithm sliding_log\nlimit 5 day", "algorithm sliding_log applies to duration windows"},
		{"unknown time zone", "limit 5 day\n@timezone Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"},
		{"time zone without a period", "limit 5\nwindow 1m\n@timezone UTC", "timezone applies to calendar periods"},
		{"ban without within", "limit 5\nwindow 1m\n@ban 1h after 5", "ban takes: ban <duration> after <n> within <duration>"},
		{"ban with a bad count", "limit 5\nwindow 1m\n@ban 1h after lots within 10s", "ban 1h after lots within 10s"},
		{"max_concurrent 0", "limit 5\nwindow 1m\n@max_concurrent 0", "max_concurrent must be a positive integer"},
		{"lease_timeout alone", "limit 5\nwindow 1m\n@lease_timeout 30s", "lease_timeout applies to max_concurrent"},
		{"count_only without status", "limit 5\nwindow 1m\n@count_only 401", "count_only takes: count_only status"},
		{"count_only bad code", "limit 5\nwindow 1m\n@count_only status 4xx 700", "count_only status takes codes (401) or classes (5xx), got '700'"},
		{"queue bad wait", "limit 5\nwindow 1m\n@queue soon", "queue: bad duration 'soon'"},
		{"jitter bad", "limit 5\nwindow 1m\n@jitter lots", "jitter must be a duration or a percentage"},
		{"deny_cache without redis", "limit 5\nwindow 1m\n@deny_cache 100", "deny_cache applies to a Redis store"},
		{"fail closed without redis", "limit 5\nwindow 1m\n@fail closed", "fail closed applies to a Redis store"},
		// Repeated subdirectives: the second line is the one to fix, and
		// the message says where the first is.
		{"name given twice", "name a\n@name b\nlimit 5\nwindow 1m", "name given twice (first on line 3)"},
		{"algorithm given twice", "algorithm fixed_window\n@algorithm sliding_log\nlimit 5\nwindow 1m", "algorithm given twice"},
		{"region given twice", "region {header.X-Region}\n@region {header.X-Zone}\nlimit 5\nwindow 1m", "region given twice"},
		{"window given twice", "limit 5\nwindow 1m\n@window 2m", "window given twice (first on line 4)"},
		{"burst given twice", "algorithm token_bucket\nlimit 5\nwindow 1m\nburst 9\n@burst 10", "burst given twice"},
		{"fail given twice", "limit 5\nwindow 1m\nredis redis://localhost:6379\nfail open\n@fail closed", "fail given twice"},
		{"clock given twice", "limit 5\nwindow 1m\nredis redis://localhost:6379\nclock app\n@clock redis", "clock given twice"},
		{"cost given twice", "limit 5\nwindow 1m\ncost 1\n@cost 2", "cost given twice"},
		{"ban given twice", "limit 5\nwindow 1m\nban 1h after 5 within 1m\n@ban 2h after 5 within 1m", "ban given twice"},
		{"jitter given twice", "limit 5\nwindow 1m\njitter 1s\n@jitter 2s", "jitter given twice"},
		{"headers given twice", "limit 5\nwindow 1m\nheaders ietf\n@headers legacy", "headers given twice"},
		{"dry_run given twice", "limit 5\nwindow 1m\ndry_run\n@dry_run", "dry_run given twice"},
		{"redis given twice", "limit 5\nwindow 1m\nredis redis://a:6379\n@redis redis://b:6379", "redis given twice"},
		{"global_limit without window twice", "region {header.X-Region}\nlimit 5\nwindow 1m\nglobal_limit 9\n@global_limit 10", "global_limit 10 given twice without a window (first on line 6)"},
		{"redis tls option twice", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\ntls {\nca /a.pem\n@ca /b.pem\n}\n}", "redis tls ca given twice"},
		// Options that do nothing where they are written.
		{"burst with sliding_counter", "algorithm sliding_counter\nlimit 5\nwindow 1m\n@burst 9", "burst is the capacity of algorithm token_bucket; sliding_counter has none"},
		{"burst with fixed_window", "algorithm fixed_window\nlimit 5\nwindow 1m\n@burst 9", "burst is the capacity of algorithm token_bucket; fixed_window has none"},
		{"window no limit uses", "limit 5 1s\nlimit 50 1m\n@window 1h", "every limit here has a window of its own: drop window"},
		{"clock app without redis", "limit 5\nwindow 1m\n@clock app", "clock app applies to a Redis store"},
		{"fail local without redis", "limit 5\nwindow 1m\n@fail local", "fail local applies to a Redis store"},
		{"sentinel_password without sentinel", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@sentinel_password pw\n}", "sentinel_password applies to sentinel"},
		{"cluster with sentinel", "limit 5\nwindow 1m\nredis {\naddress localhost:26379\nsentinel mymaster\n@cluster\n}", "cluster and sentinel exclude each other"},
		{"db on a cluster", "limit 5\nwindow 1m\nredis {\naddress a:6379 b:6379\n@db 2\n}", "a Redis Cluster has only db 0"},
		// A URL without a scheme says what to write.
		{"redis host:port without a scheme", "limit 5\nwindow 1m\n@redis 127.0.0.1:6379", "it needs a scheme: write redis://127.0.0.1:6379 (or rediss:// for TLS)"},
		{"redis host:port/db without a scheme", "limit 5\nwindow 1m\n@redis localhost:6379/0", "write redis://localhost:6379/0"},
		{"redis URL of another scheme", "limit 5\nwindow 1m\n@redis tcp://localhost:6379", "the scheme must be redis:// or rediss:// (TLS), not tcp://"},
		// Checks of several subdirectives point at the one to fix.
		{"missing window, limit elsewhere", "name x\nkey {client_ip}\n@limit 5\ncost 1", "limit 5 has no window"},
		{"cost above the limit, cost first", "@cost 6\nkey {client_ip}\nlimit 5\nwindow 1m", "cost 6 is above limit 5"},
		{"cost above the burst", "algorithm token_bucket\nlimit 5\nwindow 1m\nburst 3\n@cost 4", "cost 4 is above burst 3"},
		{"cost above one of several limits", "limit 10 1s\nlimit 1000 1h\n@cost 20", "cost 20 is above limit 10"},
		{"key_prefix with a brace, URL form", "limit 5\nwindow 1m\nredis redis://localhost:6379 {\n@key_prefix rl{\n}", "key_prefix 'rl{' must not contain"},
		{"bad limit among several", "limit 10 1s\n@limit 0 1m\nlimit 50 1h", "limit must be a positive integer (at most 2^50) or a placeholder, got '0'"},
		{"small window among several", "limit 10 1s\n@limit 5 100us\nlimit 50 1h", "window must be at least 1ms, got 100µs"},
		{"small window from window", "name x\nlimit 5\n@window 100us\nlimit 50 1h", "window must be at least 1ms, got 100µs"},
		{"window above ten years", "limit 10 1s\n@limit 5 100000d", "window must be at most 10 years"},
		{"one window twice, first elsewhere", "limit 5 1m\nlimit 50 1h\n@limit 6 1m", "two limit lines with the window 1m"},
		{"sliding_log above its entries among several", "limit 10 1s\n@limit 20000 1h", "limit 20000 on sliding_log"},
		{"global window twice", "region {header.X-Region}\nlimit 5 1m\nglobal_limit 9 1h\n@global_limit 10 1h", "two global_limit lines with the window 1h"},
		{"global_limit without region", "limit 5\nwindow 1m\n@global_limit 9", "global_limit needs region"},
		{"burst with a calendar period only", "limit 5 day\n@burst 9", "burst is the capacity of algorithm token_bucket"},
		{"deny_cache placed before redis", "limit 5\nwindow 1m\n@deny_cache 10", "deny_cache applies to a Redis store"},
		{"TLS cert without its key", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@tls {\ncert /c.pem\n}\n}", "tls: cert and key go together"},
		{"sentinel with a URL", "limit 5\nwindow 1m\nredis redis://localhost:6379 {\n@sentinel mymaster\n}", "sentinel needs the Sentinels' addresses"},
		{"bad address", "limit 5\nwindow 1m\nredis {\n@address localhost\n}", "bad address 'localhost': want host:port"},
		{"queue with no wait", "limit 5\nwindow 1m\n@queue 0s", "queue needs a positive max wait"},
		{"bad ban durations", "limit 5\nwindow 1m\n@ban 100us after 5 within 1m", "ban durations must be 1ms to 10 years"},
		{"ban with a bad duration", "limit 5\nwindow 1m\n@ban soon after 5 within 1m", "ban soon after 5 within 1m"},
		{"too many windows", "limit 1 1s\nlimit 2 2s\nlimit 3 3s\nlimit 4 4s\nlimit 5 5s\nlimit 6 6s\nlimit 7 7s\nlimit 8 8s\n@limit 9 9s\nlimit 10 10s", "at most 8 windows per limit, got 10"},
		{"log_key with a value", "limit 5\nwindow 1m\n@log_key yes", "log_key takes no value, got 'yes'"},
		{"name with two values", "@name a b\nlimit 5\nwindow 1m", "name takes one value, got more: 'b'"},
		{"burst not a number", "algorithm token_bucket\nlimit 5\nwindow 1m\n@burst lots", "burst must be a positive integer, got 'lots'"},
		{"deny_cache not a size", "limit 5\nwindow 1m\nredis redis://localhost:6379\n@deny_cache maybe", "deny_cache must be on, off or a number of keys, got 'maybe'"},
		{"queue waiters not a number", "limit 5\nwindow 1m\n@queue 1s none", "queue: max_waiters must be a positive integer, got 'none'"},
		{"queue with three values", "limit 5\nwindow 1m\n@queue 1s 5 6", "queue takes: queue <max_wait> [<max_waiters>]"},
		{"warn_at above 1", "limit 5\nwindow 1m\n@warn_at 1.5", "warn_at must be a share of the limit in (0, 1], or off, got '1.5'"},
		{"jitter above 1000%", "limit 5\nwindow 1m\n@jitter 2000%", "jitter must be a duration or a percentage in (0, 1000]"},
		{"lease_timeout below 1ms", "limit 5\nwindow 1m\nmax_concurrent 3\n@lease_timeout 100us", "lease_timeout must be at least 1ms"},
		{"redis tls unknown option", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@tls verify\n}", "redis tls: unknown option 'verify'"},
		{"redis tls unknown subdirective", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\ntls {\n@pin abc\n}\n}", "unrecognized sliding_ratelimit redis tls subdirective 'pin'"},
		{"redis state_format 5", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@state_format 5\n}", "redis state_format must be 1, 2, 3 or 4, got '5'"},
		{"redis pool_size 0", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@pool_size 0\n}", "redis pool_size must be a positive integer, got '0'"},
		{"redis negative db", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@db -1\n}", "redis db must be a non-negative integer, got '-1'"},
		{"redis dial_timeout 0", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@dial_timeout 0s\n}", "redis dial_timeout: bad duration '0s'"},
		{"redis address without a value", "limit 5\nwindow 1m\nredis {\n@address\n}", "wrong argument count"},
		{"redis cluster with a value", "limit 5\nwindow 1m\nredis {\naddress localhost:6379\n@cluster yes\n}", "wrong argument count"},
		{"redis URL with more", "limit 5\nwindow 1m\n@redis redis://localhost:6379 extra", "wrong argument count"},
		// global_redis: the redis block's forms and checks, naming global_redis.
		{"global_redis without datacenter", "%[1]s@global_redis redis://localhost:6380", "global_redis needs datacenter <name>"},
		{"datacenter without global_redis", "%[1]s@datacenter eu-west", "datacenter names this node's data centre in the ledger of global_redis, and this limiter has no global_redis"},
		{"datacenter with a space", "%[1]sglobal_redis redis://localhost:6380\n@datacenter \"eu west\"", "datacenter 'eu west' must be 1 to 64 letters, digits, '_', '-' or '.' (no spaces, braces or colons)"},
		{"datacenter with braces", "%[1]sglobal_redis redis://localhost:6380\n@datacenter eu{west}", "datacenter 'eu{west}' must be 1 to 64 letters"},
		{"datacenter given twice", "%[1]sglobal_redis redis://localhost:6380\ndatacenter eu\n@datacenter us", "datacenter given twice"},
		{"global_redis without global_limit", "region {header.X-Region}\nlimit 5 1m\n@global_redis redis://localhost:6380\ndatacenter eu", "global_redis keeps the global_limit's windows across data centres, and this limiter has no global_limit"},
		{"global_redis with count_only", "%[1]scount_only status 401\n@global_redis redis://localhost:6380\ndatacenter eu", "global_redis cannot keep a ceiling across data centres exactly with count_only"},
		{"bad global_redis URL", "%[1]sdatacenter eu\n@global_redis http://localhost:6380", "global_redis: bad URL 'http://localhost:6380'"},
		{"global_redis URL without a scheme", "%[1]sdatacenter eu\n@global_redis localhost:6380", "global_redis: bad URL 'localhost:6380': it needs a scheme: write redis://localhost:6380"},
		{"global_redis without address", "%[1]sdatacenter eu\n@global_redis {\ntimeout 1s\n}", "global_redis: needs a URL or an address"},
		{"global_redis bad timeout", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@timeout forever\n}", "global_redis timeout: bad duration 'forever'"},
		{"global_redis option twice", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\ntimeout 1s\n@timeout 2s\n}", "global_redis timeout given twice"},
		{"global_redis unknown subdirective", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@replicas 2\n}", "unrecognized sliding_ratelimit global_redis subdirective 'replicas'"},
		{"global_redis tls unknown option", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@tls verify\n}", "global_redis tls: unknown option 'verify'"},
		{"global_redis tls cert without key", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@tls {\ncert /c.pem\n}\n}", "global_redis: tls: cert and key go together"},
		{"global_redis sentinel with a URL", "%[1]sdatacenter eu\nglobal_redis redis://localhost:6380 {\n@sentinel mymaster\n}", "global_redis: sentinel needs the Sentinels' addresses"},
		{"global_redis key_prefix", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@key_prefix rl:\n}", "key_prefix does not apply to the ledger"},
		{"global_redis pipeline", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@pipeline 4\n}", "pipeline does not apply to the ledger"},
		{"global_redis scripts", "%[1]sdatacenter eu\nglobal_redis {\naddress localhost:6380\n@scripts eval\n}", "scripts does not apply to the ledger"},
		{"global_redis given twice", "%[1]sdatacenter eu\nglobal_redis redis://a:6380\n@global_redis redis://b:6380", "global_redis given twice"},
	}
	for i := range cases {
		cases[i].body = strings.ReplaceAll(cases[i].body, "%[1]s", "region {header.X-Region}\nlimit 5 1m\nglobal_limit 50 1m\n")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			line := 2
			var body []string
			for i, l := range strings.Split(tc.body, "\n") {
				if rest, ok := strings.CutPrefix(l, "@"); ok {
					line, l = 3+i, rest
				}
				body = append(body, l)
			}
			src := ":8080 {\n\tsliding_ratelimit {\n" + strings.Join(body, "\n") + "\n\t}\n\trespond ok\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
			if err == nil {
				t.Fatalf("adapted without error; want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if at := "Caddyfile:" + strconv.Itoa(line); !strings.Contains(err.Error(), at) {
				t.Errorf("error %q does not point at the line to fix, %s", err, at)
			}
		})
	}
}

// TestTwoBlocksErrorNamesBothBlocks: two blocks under one name are refused
// with both blocks' places in the message, in their files, also inside a
// route (where Caddy adds the place of the route's closing brace after it).
func TestTwoBlocksErrorNamesBothBlocks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other := filepath.Join(dir, "api.caddy")
	if err := os.WriteFile(other, []byte("sliding_ratelimit {\n\tname api\n\tlimit 6\n\twindow 1m\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, src, want string }{
		{"in routes", ":8080 {\n\troute /a {\n\t\tsliding_ratelimit {\n\t\t\tname api\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n" +
			"\troute /b {\n\t\tsliding_ratelimit {\n\t\t\tname api\n\t\t\tlimit 6\n\t\t\twindow 1m\n\t\t}\n\t}\n}\n",
			`sliding_ratelimit: two blocks named "api" with different settings, at Caddyfile:4 and Caddyfile:11: give each its own name`},
		{"default name in routes", ":8080 {\n\troute /a {\n\t\tsliding_ratelimit {\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n" +
			"\troute /b {\n\t\tsliding_ratelimit {\n\t\t\tlimit 6\n\t\t\twindow 1m\n\t\t}\n\t}\n}\n",
			`sliding_ratelimit: two blocks left at the default name "default", at Caddyfile:3 and Caddyfile:9: give each block its own name`},
		{"in two files", ":8080 {\n\tsliding_ratelimit {\n\t\tname api\n\t\tlimit 5\n\t\twindow 1m\n\t}\n\timport " + other + "\n}\n",
			`two blocks named "api" with different settings, at Caddyfile:3 and ` + other + `:2`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.src), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: adapting gives %v, want an error containing %q", c.name, err, c.want)
		}
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
		// Without lines, the error names the JSON field at fault.
		{"bad limit among several", Handler{Name: "api", Limits: []LimitConfig{{Limit: "10", Window: caddy.Duration(time.Second)}, {Limit: "0", Window: caddy.Duration(time.Minute)}}},
			"sliding_ratelimit: limiter api: limits[1]: limit must be a positive integer"},
		{"small window among several", Handler{Limit: "5", Window: caddy.Duration(time.Minute), Limits: []LimitConfig{{Limit: "10", Window: caddy.Duration(time.Microsecond)}}},
			"sliding_ratelimit: limiter default: limits[0]: window must be at least 1ms, got 1µs"},
		{"small window of limit", Handler{Limit: "5", Window: caddy.Duration(time.Microsecond)}, "sliding_ratelimit: limiter default: window must be at least 1ms"},
		{"a limit without a window", Handler{Limits: []LimitConfig{{Limit: "10"}}}, "sliding_ratelimit: limiter default: limits[0]: limit 10 has no window"},
		{"bad global window", Handler{Region: "{r}", Limit: "5", Window: caddy.Duration(time.Minute), GlobalLimits: []LimitConfig{{Limit: "7", Period: "fortnight"}}},
			"sliding_ratelimit: limiter default: global_limits[0]: global_limit 7: a window is a duration or one of hour, day, week, month, got 'fortnight'"},
		{"deny cache without redis", Handler{Limit: "5", Window: caddy.Duration(time.Minute), DenyCacheSize: 10}, "sliding_ratelimit: limiter default: deny_cache_size: deny_cache applies to a Redis store"},
		{"redis URL without a scheme", Handler{Limit: "5", Window: caddy.Duration(time.Minute), Redis: &RedisConfig{URL: "127.0.0.1:6379"}},
			"sliding_ratelimit: limiter default: redis.url: bad URL '127.0.0.1:6379': it needs a scheme: write redis://127.0.0.1:6379"},
		{"redis bad address", Handler{Limit: "5", Window: caddy.Duration(time.Minute), Redis: &RedisConfig{Addresses: []string{"localhost"}}},
			"sliding_ratelimit: limiter default: redis.addresses: bad address 'localhost'"},
		{"negative redis timeout", Handler{Limit: "5", Window: caddy.Duration(time.Minute), Redis: &RedisConfig{Addresses: []string{"localhost:6379"}, Timeout: -1}},
			"sliding_ratelimit: limiter default: redis: db, pool_size and timeouts must not be negative"},
		{"window unused", Handler{Limits: []LimitConfig{{Limit: "10", Window: caddy.Duration(time.Second)}}, Window: caddy.Duration(time.Minute)},
			"sliding_ratelimit: limiter default: window is the window of limit <n>"},
		{"burst without token_bucket", Handler{Limit: "5", Window: caddy.Duration(time.Minute), Burst: 9}, "sliding_ratelimit: limiter default: burst is the capacity of algorithm token_bucket"},
		{"global_redis without datacenter", Handler{Name: "api", Region: "{r}", Limit: "5", GlobalLimit: "50", Window: caddy.Duration(time.Minute), GlobalRedis: &RedisConfig{URL: "redis://localhost:6380"}},
			"sliding_ratelimit: limiter api: global_redis needs datacenter <name>"},
		{"global_redis bad address", Handler{Name: "api", Region: "{r}", Limit: "5", GlobalLimit: "50", Window: caddy.Duration(time.Minute), Datacenter: "eu",
			GlobalRedis: &RedisConfig{Addresses: []string{"ledger"}}},
			"sliding_ratelimit: limiter api: global_redis.addresses: bad address 'ledger'"},
		{"datacenter without global_redis", Handler{Name: "api", Limit: "5", Window: caddy.Duration(time.Minute), Datacenter: "eu"},
			"sliding_ratelimit: limiter api: datacenter names this node's data centre"},
		{"bad datacenter", Handler{Name: "api", Region: "{r}", Limit: "5", GlobalLimit: "50", Window: caddy.Duration(time.Minute), Datacenter: "eu:1",
			GlobalRedis: &RedisConfig{URL: "redis://localhost:6380"}},
			"sliding_ratelimit: limiter api: datacenter 'eu:1' must be 1 to 64 letters"},
		{"global_redis without global_limit", Handler{Name: "api", Region: "{r}", Limit: "5", Window: caddy.Duration(time.Minute), Datacenter: "eu",
			GlobalRedis: &RedisConfig{URL: "redis://localhost:6380"}},
			"sliding_ratelimit: limiter api: global_redis keeps the global_limit's windows"},
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
			scripts      eval
			state_format 1
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
			DialTimeout: caddy.Duration(300 * time.Millisecond), Timeout: caddy.Duration(40 * time.Millisecond), PoolSize: 64, Pipeline: 4, KeyPrefix: "rl:", Scripts: "eval", StateFormat: 1},
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

// TestLoadErrorsWithoutALine: what only loading finds (a TLS file that
// cannot be read, a URL from an environment variable) names the limiter and
// the subdirective, as no Caddyfile line can be given.
func TestLoadErrorsWithoutALine(t *testing.T) {
	t.Setenv("SLIDING_RATELIMIT_TEST_URL", "localhost:6379")
	missing := filepath.Join(t.TempDir(), "missing-ca.pem")
	for _, c := range []struct{ redis, want string }{
		{"redis {\n\t\t\taddress localhost:6379\n\t\t\ttls {\n\t\t\t\tca " + missing + "\n\t\t\t}\n\t\t}",
			"sliding_ratelimit: limiter files: redis tls ca: open " + missing + ": no such file or directory"},
		{"redis {env.SLIDING_RATELIMIT_TEST_URL}",
			"sliding_ratelimit: limiter files: redis.url: bad URL 'localhost:6379': it needs a scheme: write redis://localhost:6379"},
	} {
		src := ":8080 {\n\tsliding_ratelimit {\n\t\tname files\n\t\tlimit 5\n\t\twindow 1m\n\t\t" + c.redis + "\n\t}\n\trespond ok\n}\n"
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		if err := validateConfig(&cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("loading gives %v, want %q", err, c.want)
		}
	}
}
