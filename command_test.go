package slidingratelimit

// `caddy ratelimit`: its tables from the admin API's JSON, and the command
// against a running Caddy.

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/spf13/cobra"
)

// TestRatelimitTables: each subcommand's table, from the JSON the admin API
// answers.
func TestRatelimitTables(t *testing.T) {
	t.Parallel()
	decode := func(t *testing.T, s string, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(s), v); err != nil {
			t.Fatal(err)
		}
	}
	// Each subcommand's table from its JSON.
	list := func(t *testing.T, out io.Writer, js string) error {
		var ls []limiterInfo
		decode(t, js, &ls)
		return writeLimiters(out, ls)
	}
	show := func(t *testing.T, out io.Writer, js string) error {
		var u usageInfo
		decode(t, js, &u)
		return writeUsage(out, &u)
	}
	reset := func(t *testing.T, out io.Writer, js string) error {
		var r resetInfo
		decode(t, js, &r)
		return writeReset(out, &r)
	}
	top := func(t *testing.T, out io.Writer, js string) error {
		var tp topInfo
		decode(t, js, &tp)
		return writeTop(out, &tp)
	}
	for _, tc := range []struct {
		name, json string
		write      func(t *testing.T, out io.Writer, js string) error
		want       string
	}{{
		name: "list",
		json: `[{"name":"api","algorithm":"sliding_log","windows":[{"policy":"api","limit":100,"window":"1m"},{"policy":"api-1h","limit":1000,"window":"1h"},{"policy":"api-global","limit":"{http.vars.tier}","window":"1m","global":true}],"key":"{http.request.header.X-API-Key}","region":"{http.request.header.X-Region}","store":"redis","fail":"closed","ban":{"for":3600000000000,"after":20,"within":10000000000},"instances":1},
		        {"name":"per_ip","algorithm":"token_bucket","windows":[{"policy":"per_ip","limit":5,"window":"10s"}],"key":"{http.vars.client_ip}","store":"memory","fail":"open","dry_run":true,"instances":2}]`,
		write: list,
		want: `
NAME    ALGORITHM     LIMITS                                       KEY                              REGION                          STORE   FAIL    NOTES
api     sliding_log   100/1m, 1000/1h, global {http.vars.tier}/1m  {http.request.header.X-API-Key}  {http.request.header.X-Region}  redis   closed  ban 1h after 20 within 10s
per_ip  token_bucket  5/10s                                        {http.vars.client_ip}            -                               memory  open    dry run; 2 instances
`,
	}, {
		name:  "list, a global ceiling across data centres",
		json:  `[{"name":"api","algorithm":"sliding_log","windows":[{"policy":"api","limit":100,"window":"1m"},{"policy":"api-global","limit":1000,"window":"1m","global":true}],"key":"{http.request.header.X-API-Key}","region":"{http.request.header.X-Region}","store":"redis","datacenter":"eu-west","fail":"local","instances":1}]`,
		write: list,
		want: `
NAME  ALGORITHM    LIMITS                  KEY                              REGION                          STORE  FAIL   NOTES
api   sliding_log  100/1m, global 1000/1m  {http.request.header.X-API-Key}  {http.request.header.X-Region}  redis  local  global ceiling across data centres, this one eu-west
`,
	}, {
		name:  "list, none",
		json:  `[]`,
		write: list,
		want:  "\nno sliding_ratelimit limiters in the running config\n",
	}, {
		name:  "show, denied",
		json:  `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region":"us","allowed":false,"outcome":"limited","retry_after":17,"windows":[{"policy":"api","count":100,"limit":100,"remaining":0,"reset":17},{"policy":"api-global","global":true,"count":120,"limit":500,"remaining":380,"reset":3}]}`,
		write: show,
		want: `
limiter       api
key           k_live_42 (key_hash 3f2a9c01b2d4)
region        us
next request  denied (limited), retry after 17s

WINDOW      COUNT  LIMIT  REMAINING  RESET IN
api         100    100    0          17s
api-global  120    500    380        3s
`,
	}, {
		name:  "show, banned, in flight",
		json:  `{"limiter":"api","key":"","key_hash":"e3b0c44298fc","allowed":false,"outcome":"banned","retry_after":3540,"banned":true,"ban_left":3540,"in_flight":2,"windows":[{"policy":"api","count":0,"limit":10,"remaining":10,"reset":0}]}`,
		write: show,
		want: `
limiter       api
key            (key_hash e3b0c44298fc)
next request  denied (banned), retry after 59m
banned        59m left
in flight     2

WINDOW  COUNT  LIMIT  REMAINING  RESET IN
api     0      10     10         -
`,
	}, {
		name:  "show, a limiter with regions, no region given",
		json:  `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region_template":"{http.request.header.X-Region}","allowed":true,"outcome":"allowed","retry_after":0,"windows":[{"policy":"api","count":0,"limit":100,"remaining":100,"reset":0}]}`,
		write: show,
		want: `
limiter       api
key           k_live_42 (key_hash 3f2a9c01b2d4)
region        none given: the requests whose region ({http.request.header.X-Region}) is empty; --region <region> shows one region
next request  allowed

WINDOW  COUNT  LIMIT  REMAINING  RESET IN
api     0      100    100        -
`,
	}, {
		name: "show, a global ceiling across data centres",
		json: `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region":"eu","allowed":false,"outcome":"limited","retry_after":4,
		        "windows":[{"policy":"api","count":30,"limit":100,"remaining":70,"reset":40},{"policy":"api-global","global":true,"count":986,"limit":1000,"remaining":0,"reset":4}],
		        "global":{"datacenter":"eu-west","static":false,"datacenters":3,"round_trip_ms":2.125,"admitted":986,"unspent":3,
		                  "shares":[{"datacenter":"eu-west","admitted":9,"held":3,"counted":12,"rate":5},{"datacenter":"us-east","admitted":975,"held":0,"counted":980,"rate":40},{"datacenter":"ap-south","admitted":2,"held":8,"counted":8,"rate":1}]}}`,
		write: show,
		want: `
limiter       api
key           k_live_42 (key_hash 3f2a9c01b2d4)
region        eu
next request  denied (limited), retry after 4s
datacenter    eu-west (this node), on the ledger; 3 data centres known; ledger round trip 2.13ms

WINDOW      COUNT  LIMIT  REMAINING  RESET IN
api         30     100    70         40s
api-global  986    1000   0          4s

Shares of the global ceiling, as the ledger sees them
DATACENTER           ADMITTED  HELD  COUNTED  DEMAND
eu-west (this node)  9         3     12       5/s
us-east              975       0     980      40/s
ap-south             2         8     8        1/s
in all               986
  (admitted: in the longest global window, another data centre's as it last told the ledger;
  held: granted and not ended; counted: what the ledger counts, unspent units until they come back)
`,
	}, {
		name: "show, cut off from the ledger",
		json: `{"limiter":"api","key":"k","key_hash":"3f2a9c01b2d4","region":"eu","allowed":true,"outcome":"allowed","retry_after":0,"windows":[],
		        "global":{"datacenter":"eu-west","static":true,"datacenters":3,"round_trip_ms":250,"shares":[],"shares_error":"dial tcp 10.0.0.9:6379: i/o timeout"}}`,
		write: show,
		want: `
limiter       api
key           k (key_hash 3f2a9c01b2d4)
region        eu
next request  allowed
datacenter    eu-west (this node), on its static share (cut off from the ledger); 3 data centres known; ledger round trip 250ms

Shares of the global ceiling, as the ledger sees them
  the ledger did not answer: dial tcp 10.0.0.9:6379: i/o timeout
`,
	}, {
		name:  "reset, the ledger too",
		json:  `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region":"eu","reset":true,"windows":[{"policy":"api","limit":100,"window":"1m"},{"policy":"api-global","limit":1000,"window":"1m","global":true}],"other_nodes_notified":true,"ledger":true}`,
		write: reset,
		want: `
reset: limiter api, key k_live_42 (key_hash 3f2a9c01b2d4) in region eu
cleared: api 100/1m; global ceiling api-global 1000/1m (across regions); the ledger's grants (every data centre's share)
other nodes notified: yes
`,
	}, {
		name:  "reset, the ledger did not answer",
		json:  `{"limiter":"api","key":"k","key_hash":"3f2a9c01b2d4","region":"eu","reset":true,"windows":[{"policy":"api","limit":100,"window":"1m"}],"other_nodes_notified":true,"ledger_error":"i/o timeout"}`,
		write: reset,
		want: `
reset: limiter api, key k (key_hash 3f2a9c01b2d4) in region eu
cleared: api 100/1m
other nodes notified: yes
ledger: not reset, it did not answer (i/o timeout): the key's count in the global ceiling stays; reset again
`,
	}, {
		name:  "reset, the ledger's replicas did not acknowledge it",
		json:  `{"limiter":"api","key":"k","key_hash":"3f2a9c01b2d4","region":"eu","reset":true,"windows":[{"policy":"api","limit":100,"window":"1m"}],"other_nodes_notified":true,"ledger":true,"other_datacenters_told":2,"ledger_error":"limiter: a reset the ledger's replicas did not acknowledge: 0 of 1 replicas"}`,
		write: reset,
		want: `
reset: limiter api, key k (key_hash 3f2a9c01b2d4) in region eu
cleared: api 100/1m; the ledger's grants (every data centre's share); other data centres told to drop theirs: 2
other nodes notified: yes
ledger: reset on its primary, not acknowledged by its replicas (limiter: a reset the ledger's replicas did not acknowledge: 0 of 1 replicas): a failover may lose it; reset again after one
`,
	}, {
		name:  "reset",
		json:  `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region":"","reset":true,"windows":[{"policy":"api","limit":100,"window":"1m"}],"other_nodes_notified":false}`,
		write: reset,
		want: `
reset: limiter api, key k_live_42 (key_hash 3f2a9c01b2d4)
cleared: api 100/1m
other nodes notified: no (the notice could not be published: other nodes may deny the key from their deny caches until its retry time)
`,
	}, {
		name: "reset, a region, its global ceiling and ban",
		json: `{"limiter":"api","key":"k_live_42","key_hash":"3f2a9c01b2d4","region":"us","region_template":"{http.request.header.X-Region}","reset":true,
		        "windows":[{"policy":"api-1m","limit":"{http.vars.tier}","window":"1m"},{"policy":"api-day","limit":10000,"window":"day"},{"policy":"api-global","limit":500,"window":"1m","global":true}],"ban":true,"other_nodes_notified":true}`,
		write: reset,
		want: `
reset: limiter api, key k_live_42 (key_hash 3f2a9c01b2d4) in region us
cleared: api-1m {http.vars.tier}/1m; api-day 10000/day; global ceiling api-global 500/1m (across regions); ban
other nodes notified: yes
`,
	}, {
		name: "top",
		json: `{"limiter":"api","at":"2026-12-01T10:07:12Z","since":"2026-12-01T10:00:00Z","counters":1024,"keys_shown":"hash",
		        "denied":[{"key_hash":"3f2a9c01b2d4","region":"us","denials":490,"denials_error":0,"near_limit":1,"near_limit_error":0,"retry_after":17,"last_seen":"2026-12-01T10:07:09Z"},
		                  {"key_hash":"00a7e1f6d7b0","region":"eu","denials":12,"denials_error":3,"near_limit":0,"near_limit_error":0,"retry_after":3600,"last_seen":"2026-12-01T10:02:00Z"}],
		        "near_limit":[{"key_hash":"9b1c0d2e3f40","region":"us","denials":0,"denials_error":0,"near_limit":2,"near_limit_error":0,"last_seen":"2026-12-01T10:07:12Z"}]}`,
		write: top,
		want: `
limiter api on this node, 2026-12-01 10:00:00 to 10:07:12 UTC (7m12s)
keys are the first 12 hex digits of their SHA-256 (log_key shows them); a count may be ERROR above the truth

Most denied
KEY           REGION  DENIALS  ERROR  NEAR LIMIT  RETRY-AFTER  LAST SEEN
3f2a9c01b2d4  us      490      0      1           17s          3s ago
00a7e1f6d7b0  eu      12       3      0           1h           5m12s ago

Most often near their limit (warn_at crossed)
KEY           REGION  NEAR LIMIT  ERROR  DENIALS  LAST SEEN
9b1c0d2e3f40  us      2           0      0        now
`,
	}, {
		name: "top, raw keys, nothing near",
		json: `{"limiter":"api","at":"2026-12-01T10:00:30Z","since":"2026-12-01T10:00:00Z","counters":1024,"keys_shown":"raw",
		        "denied":[{"key":"k_live_42","key_hash":"3f2a9c01b2d4","denials":3,"denials_error":0,"near_limit":0,"near_limit_error":0,"retry_after":40,"last_seen":"2026-12-01T10:00:29Z"}],
		        "near_limit":[]}`,
		write: top,
		want: `
limiter api on this node, 2026-12-01 10:00:00 to 10:00:30 UTC (30s)
keys as they are (log_key); a count may be ERROR above the truth

Most denied
KEY        REGION  DENIALS  ERROR  NEAR LIMIT  RETRY-AFTER  LAST SEEN
k_live_42  -       3        0      0           40s          1s ago

Most often near their limit (warn_at crossed)
  none
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			if err := tc.write(t, &out, tc.json); err != nil {
				t.Fatal(err)
			}
			if got := "\n" + out.String(); got != tc.want {
				t.Errorf("got:%s\nwant:%s", got, tc.want)
			}
		})
	}
}

// runRatelimit runs `caddy ratelimit <args>` as Caddy's command line
// would, and returns what it printed.
func runRatelimit(args ...string) (string, error) {
	root := &cobra.Command{Use: "ratelimit", SilenceUsage: true}
	ratelimitCommand(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startCaddy runs caddyfile in this process's Caddy; at the end it puts
// back what caddytest runs (its bare admin endpoint on 2999), or stops Caddy
// if nothing ran before.
func startCaddy(t *testing.T, caddyfile string) {
	t.Helper()
	adapt := func(cf string) []byte {
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		return cfg
	}
	wasRunning := caddy.ActiveContext().Context != nil
	if err := caddy.Load(adapt(caddyfile), true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() {
		if !wasRunning {
			caddy.Stop()
			return
		}
		if err := caddy.Load(adapt("{\n\tadmin localhost:2999\n}\n"), true); err != nil {
			t.Logf("restoring caddytest's admin endpoint: %v", err)
		}
	})
}

// TestRatelimitCommand runs `caddy ratelimit` against this process's Caddy,
// its admin endpoint and site on free ports, after traffic: the tables show
// the limiter, the key, the top offender; reset resets; --config finds the
// address; errors say what is wrong. Not parallel: Caddy is one per process.
func TestRatelimitCommand(t *testing.T) {
	name := uniqueName()
	admin, web := freeAddr(t), freeAddr(t)
	config := `{
	admin ` + admin + `
	skip_install_trust
	grace_period 1ns
}
http://` + web + ` {
	sliding_ratelimit {
		name   ` + name + `
		key    {http.request.header.X-API-Key}
		region {http.request.header.X-Region}
		limit  5
		window 1m
	}
	respond "ok"
}
http://` + freeAddr(t) + ` {
	map {http.request.header.X-API-Key} {tier_limit} {tier_global} {
		default 5 50
	}
	sliding_ratelimit {
		name   tiered-` + name + `
		key    {http.request.header.X-API-Key}
		region {http.request.header.X-Region}
		limit  {tier_limit}
		global_limit {tier_global}
		window 1m
	}
	respond "ok"
}
`
	startCaddy(t, config)
	get := func(hdr map[string]string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+web+"/", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	hdr := map[string]string{"X-API-Key": "k_live_42", "X-Region": "us"}
	for range 8 { // 5 allowed, 3 denied
		get(hdr)
	}
	get(map[string]string{"X-API-Key": "k_other", "X-Region": "us"})

	run := func(args ...string) string {
		t.Helper()
		out, err := runRatelimit(append(args, "--address", admin)...)
		if err != nil {
			t.Fatalf("caddy ratelimit %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	// row finds the line of out whose first column is first, as columns.
	row := func(out, first string) []string {
		t.Helper()
		for line := range strings.Lines(out) {
			if f := strings.Fields(line); len(f) > 0 && f[0] == first {
				return f
			}
		}
		t.Fatalf("no line starting with %q in:\n%s", first, out)
		return nil
	}
	same := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}

	out := run("list")
	same("list header", row(out, "NAME"), "NAME", "ALGORITHM", "LIMITS", "KEY", "REGION", "STORE", "FAIL", "NOTES")
	same("list row", row(out, name), name, "sliding_log", "5/1m", "{http.request.header.X-API-Key}", "{http.request.header.X-Region}", "memory", "open", "-")

	out = run("show", "--name", name, "--key", "k_live_42", "--region", "us")
	hash := sha12("k_live_42")
	same("show key", row(out, "key"), "key", "k_live_42", "(key_hash", hash+")")
	if f := row(out, "next"); strings.Join(f[:4], " ") != "next request denied (limited)," {
		t.Errorf("show next: %q", f)
	}
	same("show window", row(out, name)[:4], name, "5", "5", "0")
	out = run("show", "--name", name, "--key", "k_live_42") // no --region
	same("show with no region", row(out, "region")[:4], "region", "none", "given:", "the")

	out = run("top", "--name", name, "-n", "5")
	d := row(out, hash)
	same("top row", d[:5], hash, "us", "3", "0", "1")
	if !regexp.MustCompile(`^(59s|1m)$`).MatchString(d[5]) {
		t.Errorf("top retry-after %q", d[5])
	}
	if strings.Contains(out, sha12("k_other")) {
		t.Errorf("k_other, never denied nor near, in the top:\n%s", out)
	}

	out = run("reset", "--name", name, "--key", "k_live_42", "--region", "us")
	same("reset", row(out, "reset:"), "reset:", "limiter", name+",", "key", "k_live_42", "(key_hash", hash+")", "in", "region", "us")
	same("reset cleared", row(out, "cleared:"), "cleared:", name, "5/1m")
	out = run("show", "--name", name, "--key", "k_live_42", "--region", "us")
	same("after reset", row(out, "next"), "next", "request", "allowed")

	// --json: the admin API's JSON.
	out = run("show", "--name", name, "--key", "k_live_42", "--region", "us", "--json")
	var u usageInfo
	if err := json.Unmarshal([]byte(out), &u); err != nil || u.KeyHash != hash || !u.Allowed {
		t.Errorf("--json: %v %s", err, out)
	}

	// The address from --config, as caddy stop finds it.
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runRatelimit("list", "--config", file); err != nil || !strings.Contains(out, name) {
		t.Errorf("list --config: %v\n%s", err, out)
	}

	// Errors.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "--name", "nope", "--key", "k", "--address", admin}, "no limiter named 'nope' (HTTP 404 from " + admin + ")"},
		{[]string{"top", "--name", "nope", "--address", admin}, "no limiter named 'nope' (HTTP 404"},
		{[]string{"top", "--name", name, "-n", "0", "--address", admin}, "n must be an integer from 1 to 1024, got '0' (HTTP 400"},
		{[]string{"show", "--name", name, "--address", admin}, "--key is required"},
		{[]string{"show", "--name", "tiered-" + name, "--key", "k", "--address", admin},
			"this limiter's values come from placeholders; give the client's: --limit <n> (limit {tier_limit}), --global-limit <n> (global_limit {tier_global}) (HTTP 400 from " + admin + ")"},
		{[]string{"show", "--name", "tiered-" + name, "--key", "k", "--limit", "5", "--global-limit", "x", "--address", admin},
			"this limiter's values come from placeholders; give the client's: --global-limit <n> (global_limit {tier_global}, got 'x') (HTTP 400 from " + admin + ")"},
		{[]string{"reset", "--key", "k", "--address", admin}, "--name is required"},
		{[]string{"list", "--address", freeAddr(t)}, "cannot reach Caddy's admin API at 127.0.0.1:"},
	} {
		if _, err := runRatelimit(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("caddy ratelimit %s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
