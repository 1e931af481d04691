package rls

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/defaults"
	"io"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redisconf"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// File is the YAML configuration: envoyproxy/ratelimit's shape (domain,
// nested descriptors of key and value, rate_limit of unit and
// requests_per_unit, shadow_mode, detailed_metric), with this engine's
// settings beside it. Every field is optional but domain and descriptors.
type File struct {
	Domain      string       `yaml:"domain"`
	Descriptors []Descriptor `yaml:"descriptors"`

	// Algorithm is the default of every rate_limit: sliding_log (exact,
	// the default), sliding_counter, fixed_window or token_bucket.
	Algorithm string `yaml:"algorithm"`
	// Fail is what happens when Redis cannot answer: open (the default),
	// closed (OVER_LIMIT) or local (decided in this process meanwhile).
	Fail string `yaml:"fail"`
	// Clock is redis (Redis TIME, the default) or app (this process's).
	Clock string `yaml:"clock"`
	// Headers chooses response_headers_to_add: ietf (RateLimit and
	// RateLimit-Policy, the default), legacy (X-RateLimit-*), both or off.
	Headers string `yaml:"headers"`
	// Timezone is the IANA time zone of the month unit. Default UTC.
	Timezone string `yaml:"timezone"`
	// DenyCacheSize bounds the over-limit cache in front of Redis: 0 the
	// default, -1 off.
	DenyCacheSize int `yaml:"deny_cache_size"`
	// Redis is the store the service instances share; none keeps the
	// counts in this process.
	Redis *Redis `yaml:"redis"`
	// GlobalRedis is the ledger of the global ceilings across data
	// centres; Datacenter names this one.
	GlobalRedis *Redis `yaml:"global_redis"`
	Datacenter  string `yaml:"datacenter"`
}

// Descriptor is one level of the descriptor tree: an entry's key, and its
// value (none: every value, each counted apart), the rate limit of a
// request descriptor that ends here, and the levels under it.
type Descriptor struct {
	Key         string       `yaml:"key"`
	Value       string       `yaml:"value"`
	RateLimit   *RateLimit   `yaml:"rate_limit"`
	Descriptors []Descriptor `yaml:"descriptors"`
	ShadowMode  bool         `yaml:"shadow_mode"`
	// DetailedMetric is accepted: every rule has its own series already
	// (its name is the limiter label), and no client value becomes a
	// label.
	DetailedMetric bool `yaml:"detailed_metric"`
}

// RateLimit is a descriptor's limit: requests_per_unit per unit
// (envoyproxy/ratelimit's), and this engine's extensions.
type RateLimit struct {
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	// Name names the limit (the limiter label of the metrics, the
	// RateLimit header's policy name). Default: from the descriptor path.
	Name      string `yaml:"name"`
	Unlimited bool   `yaml:"unlimited"`
	// Algorithm overrides the file's.
	Algorithm string `yaml:"algorithm"`
	// Windows are more windows the request must fit too (each a
	// requests_per_unit and a unit, or a window such as 90s).
	Windows []WindowSpec `yaml:"windows"`
	// Burst is a token_bucket's capacity (one window).
	Burst int64 `yaml:"burst"`
	// Ban: after denials within within, the key is refused for for.
	Ban *BanSpec `yaml:"ban"`
	// RegionKey names the descriptor entry that is the request's region:
	// each region has its own budget, under the global ceiling.
	RegionKey string `yaml:"region_key"`
	// Global is the ceiling across regions (needs region_key).
	Global []WindowSpec `yaml:"global"`
}

// WindowSpec is one more window: requests_per_unit per unit, or per
// window (a duration).
type WindowSpec struct {
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Window          string `yaml:"window"`
}

// BanSpec is a penalty box.
type BanSpec struct {
	After  int64  `yaml:"after"`
	Within string `yaml:"within"`
	For    string `yaml:"for"`
}

// Redis is internal/redisconf's configuration in YAML: one server (url,
// or one address), a Cluster (several addresses, or cluster: true), a
// Sentinel group; TLS, an ACL user.
type Redis struct {
	URL              string   `yaml:"url"`
	Addresses        []string `yaml:"addresses"`
	Cluster          bool     `yaml:"cluster"`
	Sentinel         string   `yaml:"sentinel"`
	SentinelPassword string   `yaml:"sentinel_password"`
	Username         string   `yaml:"username"`
	Password         string   `yaml:"password"`
	DB               int      `yaml:"db"`
	TLS              *TLS     `yaml:"tls"`
	DialTimeout      string   `yaml:"dial_timeout"`
	Timeout          string   `yaml:"timeout"`
	PoolSize         int      `yaml:"pool_size"`
	Pipeline         int      `yaml:"pipeline"`
	KeyPrefix        string   `yaml:"key_prefix"`
	Scripts          string   `yaml:"scripts"`
	StateFormat      int      `yaml:"state_format"`
}

// TLS is TLS to Redis: a CA file, a client certificate and key, the
// server name checked.
type TLS struct {
	CA                 string `yaml:"ca"`
	Cert               string `yaml:"cert"`
	Key                string `yaml:"key"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// Error is a configuration error; Field is the path of the field at fault
// ("descriptors[0].rate_limit.unit").
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return "rls config: " + e.Msg
	}
	return "rls config: " + e.Field + ": " + e.Msg
}

func errAt(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Parse reads a YAML configuration. An unknown field, a value of the
// wrong type or a missing one is an *Error naming the field.
func Parse(data []byte) (*File, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errAt("", "the file is empty: it needs a domain and descriptors")
		}
		return nil, yamlErr(data, err)
	}
	if f.Domain == "" {
		return nil, errAt("domain", "a domain is required (the domain Envoy's rate_limits send)")
	}
	if len(f.Descriptors) == 0 {
		return nil, errAt("descriptors", "at least one descriptor is required")
	}
	return &f, nil
}

// yamlErr names the field of a YAML decoding error: yaml.v3 says the
// line, and the value (a type error) or the key (an unknown field); the
// field is the path of that node in the document.
func yamlErr(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) == 0 {
		return errAt("", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return errAt("", "%s", strings.Join(te.Errors, "; "))
	}
	msg := te.Errors[0]
	var line int
	if _, e := fmt.Sscanf(msg, "line %d:", &line); e != nil {
		return errAt("", "%s", msg)
	}
	what := strings.TrimSpace(msg[strings.IndexByte(msg, ':')+1:])
	key, value := "", ""
	if f, ok := strings.CutPrefix(what, "field "); ok {
		key, _, _ = strings.Cut(f, " not found")
		what = "unknown field (see docs/migrating.md for the fields)"
	} else if _, rest, ok := strings.Cut(what, "`"); ok {
		value, _, _ = strings.Cut(rest, "`")
	}
	field := nodePath(&doc, line, key, value, "")
	if field == "" {
		return errAt("", "%s", msg)
	}
	return errAt(field, "%s (line %d)", what, line)
}

// nodePath is the path ("descriptors[0].rate_limit.unit") of the key named
// key, or of the value value, on line (neither: of a key on line whose
// value is a list or a map); "" when none is there.
func nodePath(n *yaml.Node, line int, key, value, path string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p := nodePath(c, line, key, value, path); p != "" {
				return p
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if p := nodePath(c, line, key, value, fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			switch {
			case key != "" && k.Line == line && k.Value == key:
				return p
			case value != "" && v.Kind == yaml.ScalarNode && v.Line == line && v.Value == value:
				return p
			case key == "" && value == "" && v.Kind != yaml.ScalarNode && k.Line == line:
				return p // a list or a map of the wrong type
			}
			if p := nodePath(v, line, key, value, p); p != "" {
				return p
			}
		}
	}
	return ""
}

// units are envoyproxy/ratelimit's units. The duration units are sliding
// windows of their length (fixed ones with fixed_window); month is the
// calendar month (in timezone); year is 365 days, as envoyproxy/ratelimit
// counts it.
var units = map[string]limiter.Window{
	"second": {Duration: time.Second},
	"minute": {Duration: time.Minute},
	"hour":   {Duration: time.Hour},
	"day":    {Duration: 24 * time.Hour},
	"week":   {Duration: 7 * 24 * time.Hour},
	"month":  {Period: limiter.PeriodMonth},
	"year":   {Duration: 365 * 24 * time.Hour},
}

func parseUnit(field, s string) (limiter.Window, error) {
	w, ok := units[strings.ToLower(s)]
	switch {
	case ok:
		return w, nil
	case s == "":
		return w, errAt(field, "a unit is required: second, minute, hour, day, week, month or year")
	}
	return w, errAt(field, "invalid rate limit unit '%s': want second, minute, hour, day, week, month or year", s)
}

// rule is one rate limit of the tree, ready to decide: its limiter's
// policy and static limits.
type rule struct {
	path    string // the descriptor path, for logs and names
	name    string
	policy  limiter.Policy
	limits  []int64
	globals []int64
	region  string // the entry key that is the region
	shadow  bool
	// unlimited: matched, never limited.
	unlimited bool
	lim       *limiter.Limiter
	plan      reply.Plan
	metrics   *limitmetrics.Limiter
}

// node is one level of the tree: its rule and the levels under it, by
// "key_value" and by "key".
type node struct {
	rule     *rule
	next     map[string]*node
	prefixes []prefix
}

// prefix is a level whose value ends in '*': every value that starts with
// prefix.
type prefix struct {
	key, prefix string
	node        *node
}

// compile checks f and builds its tree of rules. base is the policy every
// rule starts from (fail mode, clock, store settings).
func (f *File) compile(base limiter.Policy) (*node, []*rule, error) {
	root := &node{next: map[string]*node{}}
	var rules []*rule
	names := map[string]bool{}
	var walk func(n *node, ds []Descriptor, field, path string, keys []string) error
	walk = func(n *node, ds []Descriptor, field, path string, keys []string) error {
		for i, d := range ds {
			at := fmt.Sprintf("%s[%d]", field, i)
			if d.Key == "" {
				return errAt(at+".key", "descriptor has an empty key")
			}
			k := d.Key
			if d.Value != "" {
				k += "_" + d.Value
			}
			if _, dup := n.next[k]; dup {
				return errAt(at, "duplicate descriptor '%s' at this level", k)
			}
			p := path + "." + k
			child := &node{next: map[string]*node{}}
			switch star := strings.IndexByte(d.Value, '*'); {
			case star < 0:
				n.next[k] = child
			case star == len(d.Value)-1:
				n.next[k] = child // the duplicate check; and the value "api*" itself
				n.prefixes = append(n.prefixes, prefix{key: d.Key, prefix: d.Value[:star], node: child})
			default:
				return errAt(at+".value", "a wildcard value ends in '*' (a prefix, 'api*'); '%s' has one elsewhere", d.Value)
			}
			keys := append(slices.Clip(keys), d.Key)
			if d.RateLimit != nil {
				if rk := d.RateLimit.RegionKey; rk != "" && !slices.Contains(keys, rk) {
					return errAt(at+".rate_limit.region_key", "'%s' is not a key of this descriptor's path (%s): the region is the value of one of its entries", rk, strings.Join(keys, ", "))
				}
				r, err := f.rule(base, d, at, p)
				if err != nil {
					return err
				}
				if !r.unlimited {
					if names[r.name] {
						if d.RateLimit.Name != "" {
							return errAt(at+".rate_limit.name", "the name '%s' is used twice", r.name)
						}
						r.name = hashedName(p)
					}
					names[r.name] = true
					r.policy.Name = r.name
					rules = append(rules, r)
				}
				child.rule = r
			} else if d.ShadowMode {
				return errAt(at+".shadow_mode", "shadow_mode applies to a rate_limit, and this descriptor has none")
			}
			if err := walk(child, d.Descriptors, at+".descriptors", p, keys); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root, f.Descriptors, "descriptors", f.Domain, nil); err != nil {
		return nil, nil, err
	}
	return root, rules, nil
}

// rule checks one rate_limit and makes its policy.
func (f *File) rule(base limiter.Policy, d Descriptor, at, path string) (*rule, error) {
	rl := d.RateLimit
	at += ".rate_limit"
	r := &rule{path: path, shadow: d.ShadowMode, region: rl.RegionKey}
	if rl.Unlimited {
		if rl.Unit != "" || rl.RequestsPerUnit != 0 || len(rl.Windows) > 0 {
			return nil, errAt(at+".unlimited", "an unlimited rate_limit has no unit, requests_per_unit nor windows")
		}
		r.unlimited = true
		return r, nil
	}
	p := base
	p.DryRun = d.ShadowMode
	p.Burst = rl.Burst
	alg := cmpOr(rl.Algorithm, f.Algorithm)
	var err error
	if alg != "" {
		field := at + ".algorithm"
		if rl.Algorithm == "" {
			field = "algorithm"
		}
		if p.Algorithm, err = limiter.ParseAlgorithm(alg); err != nil {
			return nil, errAt(field, "%v", err)
		}
	}
	var specs []WindowSpec
	var fields []string
	if rl.Unit != "" || rl.RequestsPerUnit != 0 || len(rl.Windows) == 0 {
		specs, fields = append(specs, WindowSpec{RequestsPerUnit: rl.RequestsPerUnit, Unit: rl.Unit}), append(fields, at)
	}
	for i, w := range rl.Windows {
		specs, fields = append(specs, w), append(fields, fmt.Sprintf("%s.windows[%d]", at, i))
	}
	if p.Windows, r.limits, err = windows(fields, specs); err != nil {
		return nil, err
	}
	var gfields []string
	for i := range rl.Global {
		gfields = append(gfields, fmt.Sprintf("%s.global[%d]", at, i))
	}
	if len(rl.Global) > 0 && rl.RegionKey == "" {
		return nil, errAt(at+".global", "a global ceiling is the limit across regions: give region_key, the descriptor entry that names the region")
	}
	if p.GlobalWindows, r.globals, err = windows(gfields, rl.Global); err != nil {
		return nil, err
	}
	p.Regions = rl.RegionKey != ""
	if p.Location, err = f.location(p.Windows, p.GlobalWindows); err != nil {
		return nil, err
	}
	if p.Ban, err = ban(at+".ban", rl.Ban); err != nil {
		return nil, err
	}
	for i, l := range r.limits {
		if p.Algorithm == limiter.SlidingLog && p.Windows[i].Period == limiter.PeriodNone && l > limiter.MaxLogEntries {
			return nil, errAt(fields[i]+".requests_per_unit", "limit %d on sliding_log: the log keeps one entry per request, at most %d per key and window; use algorithm: sliding_counter for this rate", l, limiter.MaxLogEntries)
		}
	}
	r.name = rl.Name
	if r.name == "" {
		r.name = derivedName(path)
	} else if err := limiter.ValidName(r.name); err != nil {
		return nil, errAt(at+".name", "%v", err)
	}
	p.Name = r.name
	if err := p.Check(); err != nil {
		return nil, policyErr(at, fields, gfields, err)
	}
	r.policy = p
	return r, nil
}

// location is the time zone of calendar periods (timezone, default
// UTC), nil when the windows have none.
func (f *File) location(ws, globals []limiter.Window) (*time.Location, error) {
	if !reply.HasPeriod(ws) && !reply.HasPeriod(globals) {
		return nil, nil
	}
	if f.Timezone == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(f.Timezone)
	if err != nil {
		return nil, errAt("timezone", "unknown time zone '%s': %v", f.Timezone, err)
	}
	return loc, nil
}

// ban is the engine's penalty box of b (nil: none).
func ban(at string, b *BanSpec) (*limiter.Ban, error) {
	if b == nil {
		return nil, nil
	}
	out := &limiter.Ban{After: b.After}
	var err error
	if out.Within, err = duration(at+".within", b.Within); err != nil {
		return nil, err
	}
	if out.For, err = duration(at+".for", b.For); err != nil {
		return nil, err
	}
	return out, nil
}

// policyErr names the field of an engine policy error.
func policyErr(at string, fields, gfields []string, err error) error {
	var pe *limiter.PolicyError
	if !errors.As(err, &pe) {
		return errAt(at, "%v", err)
	}
	field := at
	switch {
	case pe.Window > 0 && pe.Global && pe.Window <= len(gfields):
		field = gfields[pe.Window-1]
	case pe.Window > 0 && !pe.Global && pe.Window <= len(fields):
		field = fields[pe.Window-1]
	case pe.Field != "":
		field = at + "." + pe.Field
	}
	return errAt(field, "%v", pe.Err)
}

// windows is the engine's windows of specs (fields names each), and
// their limits.
func windows(fields []string, specs []WindowSpec) ([]limiter.Window, []int64, error) {
	var ws []limiter.Window
	var limits []int64
	for i, s := range specs {
		field := fields[i]
		var w limiter.Window
		var err error
		switch {
		case s.Unit != "" && s.Window != "":
			return nil, nil, errAt(field, "give a unit or a window, not both")
		case s.Window != "":
			if w.Duration, err = duration(field+".window", s.Window); err != nil {
				return nil, nil, err
			}
		default:
			if w, err = parseUnit(field+".unit", s.Unit); err != nil {
				return nil, nil, err
			}
		}
		if s.RequestsPerUnit < 1 || s.RequestsPerUnit > limiter.MaxValue {
			return nil, nil, errAt(field+".requests_per_unit", "must be a positive integer up to 2^50, got %d", s.RequestsPerUnit)
		}
		ws, limits = append(ws, w), append(limits, s.RequestsPerUnit)
	}
	return ws, limits, nil
}

// duration parses a Go duration ("90s", "10m") of at least 1ms.
func duration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, errAt(field, "a duration is required (such as 30s or 10m)")
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond {
		return 0, errAt(field, "want a duration of at least 1ms (such as 30s or 10m), got '%s'", s)
	}
	return d, nil
}

// derivedName is a limiter name of a descriptor path: the path itself
// when it is a valid name, else a readable start of it and a hash of the
// whole (so two paths never share keys).
func derivedName(path string) string {
	if limiter.ValidName(path) == nil {
		return path
	}
	return hashedName(path)
}

// hashedName is a name of a path: a readable start and a hash.
func hashedName(path string) string {
	sum := sha256.Sum256([]byte(path))
	start := []byte(path)
	if len(start) > 40 {
		start = start[:40]
	}
	for i, c := range start {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			start[i] = '_'
		}
	}
	return string(start) + "-" + hex.EncodeToString(sum[:6])
}

// storeConfig is the redisconf configuration of r.
func (r *Redis) storeConfig(field string) (*redisconf.Config, error) {
	c := &redisconf.Config{URL: r.URL, Addresses: r.Addresses, Cluster: r.Cluster, Sentinel: r.Sentinel,
		SentinelPassword: r.SentinelPassword, Username: r.Username, Password: r.Password, DB: r.DB,
		PoolSize: r.PoolSize, Pipeline: r.Pipeline, KeyPrefix: r.KeyPrefix, Scripts: r.Scripts, StateFormat: r.StateFormat}
	if r.TLS != nil {
		c.TLS = &redisconf.TLS{CA: r.TLS.CA, Cert: r.TLS.Cert, Key: r.TLS.Key, ServerName: r.TLS.ServerName, InsecureSkipVerify: r.TLS.InsecureSkipVerify}
	}
	var err error
	if r.DialTimeout != "" {
		if c.DialTimeout, err = duration(field+".dial_timeout", r.DialTimeout); err != nil {
			return nil, err
		}
	}
	if r.Timeout != "" {
		if c.Timeout, err = duration(field+".timeout", r.Timeout); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func redisErr(field string, e *redisconf.Error) error {
	if e.Sub != "" {
		field += "." + e.Sub
	}
	return errAt(field, "%s", e.Msg)
}

func cmpOr(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// check checks the file's own settings.
func (f *File) check() error {
	for _, e := range []struct {
		field, v string
		allowed  []string
	}{{"fail", f.Fail, defaults.FailModes}, {"clock", f.Clock, defaults.Clocks},
		{"headers", f.Headers, reply.HeaderModes}} {
		if e.v != "" && !slices.Contains(e.allowed, e.v) {
			return errAt(e.field, "must be %s, got '%s'", strings.Join(e.allowed, ", "), e.v)
		}
	}
	if (f.Fail == "closed" || f.Fail == "local") && f.Redis == nil {
		return errAt("fail", "fail %s applies to a Redis store (the in-process store does not fail)", f.Fail)
	}
	if f.DenyCacheSize < -1 {
		return errAt("deny_cache_size", "must be -1 (off), 0 (default) or a size, got %d", f.DenyCacheSize)
	}
	if f.DenyCacheSize != 0 && f.Redis == nil {
		return errAt("deny_cache_size", "applies to a Redis store (the in-process store needs no cache)")
	}
	if f.GlobalRedis == nil && f.Datacenter != "" {
		return errAt("datacenter", "names this data centre in the ledger of global_redis, and this file has no global_redis")
	}
	if f.GlobalRedis != nil && limiter.ValidName(f.Datacenter) != nil {
		return errAt("datacenter", "global_redis needs a datacenter of 1 to 64 letters, digits, '_', '-' or '.', got '%s'", f.Datacenter)
	}
	return nil
}
