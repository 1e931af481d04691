package rls_test

import (
	"context"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/rls"
)

// TestBadConfigNamesTheField: each bad configuration is refused with an
// error naming the field at fault.
func TestBadConfigNamesTheField(t *testing.T) {
	t.Parallel()
	const d = "domain: d\ndescriptors:\n"
	for _, c := range []struct{ yaml, want string }{
		{"", "empty"},
		{"descriptors: [{key: a}]", "domain: a domain is required"},
		{"domain: d", "descriptors: at least one"},
		{"domain: d\ndescriptors: [{key: a, rate_limits: {}}]", "descriptors[0].rate_limits: unknown field"},
		{"domain: d\ndescriptors: {key: a}", "descriptors: cannot unmarshal !!map"},
		{"domain: [d]", "domain: cannot unmarshal !!seq into string (line 1)"},
		{d + "  - key: a\n    quota_mode: true", "descriptors[0].quota_mode: unknown field"},
		{d + "  - key: a\n    shadow_mode: maybe", "descriptors[0].shadow_mode: cannot unmarshal !!str `maybe` into bool (line 4)"},
		{d + "  - key: a\n    rate_limit:\n      unit: [second]\n      requests_per_unit: 1", "descriptors[0].rate_limit.unit: cannot unmarshal !!seq"},
		{d + "  - value: x", "descriptors[0].key: descriptor has an empty key"},
		{d + "  - key: a\n  - key: a", "descriptors[1]: duplicate descriptor 'a'"},
		{d + "  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"},
		{d + "  - key: a\n    rate_limit: {unit: Fortnight}", "descriptors[0].rate_limit.unit: invalid rate limit unit 'Fortnight'"},
		{d + "  - key: a\n    rate_limit: {unit: second}", "descriptors[0].rate_limit.requests_per_unit: must be a positive integer"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: -3}", "descriptors[0].rate_limit.requests_per_unit"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: ten}", "descriptors[0].rate_limit.requests_per_unit: cannot unmarshal !!str `ten` into int64 (line 4)"},
		{d + "  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 1, algorithm: leaky}", "descriptors[0].descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky'"},
		{d + "  - key: a\n    rate_limit: {unit: day, requests_per_unit: 20000}", "descriptors[0].rate_limit.requests_per_unit: limit 20000 on sliding_log"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, windows: [{requests_per_unit: 5, window: soon}]}", "descriptors[0].rate_limit.windows[0].window: want a duration"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, ban: {after: 2, for: 1m}}", "descriptors[0].rate_limit.ban.within: a duration is required"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, global: [{unit: minute, requests_per_unit: 9}]}", "descriptors[0].rate_limit.global: a global ceiling"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, region_key: dc}", "descriptors[0].rate_limit.region_key: 'dc' is not a key"},
		{d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: 'a b'}", "descriptors[0].rate_limit.name"},
		{d + "  - key: a\n    rate_limit: {unlimited: true, unit: second}", "descriptors[0].rate_limit.unlimited"},
		{d + "  - key: a\n    value: 'x*y'\n    rate_limit: {unit: second, requests_per_unit: 1}", "descriptors[0].value: a wildcard value ends in '*'"},
		{d + "  - key: a\n    shadow_mode: true", "descriptors[0].shadow_mode: shadow_mode applies to a rate_limit"},
		{"fail: shut\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "fail: must be open, closed, local"},
		{"fail: closed\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "fail: fail closed applies to a Redis store"},
		{"headers: all\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "headers: must be both, ietf, legacy, off"},
		{"redis: {url: 'http://x:1'}\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "redis.url: bad URL"},
		{"redis: {addresses: [nohost]}\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "redis.address: bad address 'nohost'"},
		{"redis: {addresses: ['127.0.0.1:1'], timeout: fast}\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "redis.timeout: want a duration"},
		{"redis: {addresses: ['127.0.0.1:1'], tls: {cert: c.pem}}\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "redis.tls: tls: cert and key go together"},
		{"datacenter: eu\n" + d + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}", "datacenter: names this data centre"},
	} {
		svc, err := rls.Load([]byte(c.yaml), rls.Options{})
		if err == nil {
			_ = svc.Close()
			t.Errorf("%q loaded, want an error with %q", c.yaml, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "rls config: ") {
			t.Errorf("%q: %v\nwant an error with %q", c.yaml, err, c.want)
		}
	}
}

// FuzzConfig: no configuration panics, and one that loads answers any
// descriptor of its own keys without a panic.
func FuzzConfig(f *testing.F) {
	f.Add(messaging, "to_number", "1")
	f.Add("domain: d\ndescriptors: [{key: a, value: 'b*', rate_limit: {unit: month, requests_per_unit: 3, windows: [{requests_per_unit: 1, window: 1ms}]}}]", "a", "bc")
	f.Add("domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 0}}]", "a", "")
	f.Add("domain: d\ndescriptors: [{key: a, descriptors: [{key: b, rate_limit: {region_key: a, unit: minute, requests_per_unit: 2, global: [{requests_per_unit: 1, unit: hour}]}}]}]", "a", "x")
	f.Fuzz(func(t *testing.T, config, key, value string) {
		svc, err := rls.Load([]byte(config), rls.Options{})
		if err != nil {
			return
		}
		defer svc.Close()
		req := &pb.RateLimitRequest{Domain: "d", HitsAddend: uint32(len(value)), Descriptors: []*rlv3.RateLimitDescriptor{
			desc(key, value), desc(key, value, "b", value), desc("to_number", value)}}
		_, _ = svc.ShouldRateLimit(context.Background(), req)
		req.Domain = "messaging"
		_, _ = svc.ShouldRateLimit(context.Background(), req)
	})
}

// TestMigratingExampleLoads: the envoyproxy/ratelimit config that
// docs/migrating.md says loads as is does, and decides as it says: 5
// marketing messages a day per number, 100 of any.
func TestMigratingExampleLoads(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(string(doc), "\n# From envoyproxy/ratelimit\n")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(rest)
	if !found || block == nil {
		t.Fatal("docs/migrating.md has no yaml block under # From envoyproxy/ratelimit")
	}
	c := serve(t, block[1], newClock())
	for i := 1; i <= 6; i++ {
		code, _ := one(t, c, "messaging", desc("message_type", "marketing", "to_number", "1"))
		if (code == over) != (i == 6) {
			t.Fatalf("marketing message %d: %v", i, code)
		}
	}
	if _, st := one(t, c, "messaging", desc("to_number", "1")); st.Code != ok || st.CurrentLimit.GetRequestsPerUnit() != 100 || st.LimitRemaining != 99 {
		t.Fatalf("any message: %v", st)
	}
}

// TestDomainsRefuseSharedNames: two domains whose rules take one limiter
// name would share their counts: refused, naming both.
func TestDomainsRefuseSharedNames(t *testing.T) {
	t.Parallel()
	var svcs []*rls.Service
	for _, d := range []string{"a", "b"} {
		svc, err := rls.Load([]byte("domain: "+d+"\ndescriptors: [{key: k, rate_limit: {name: shared, unit: minute, requests_per_unit: 1}}]"), rls.Options{Metrics: rls.NewMetrics("")})
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Close()
		svcs = append(svcs, svc)
	}
	if _, err := rls.NewDomains(svcs...); err == nil || !strings.Contains(err.Error(), "rate_limit.name: the name 'shared' is used in domain a and in domain b") {
		t.Fatalf("shared name: %v", err)
	}
}

// TestReferenceNamesEveryField: docs/reference.md's section on the service
// names every YAML field the configuration has.
func TestReferenceNamesEveryField(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ := strings.Cut(string(doc), "\n## Envoy's rate limit service\n")
	sec, _, _ = strings.Cut(sec, "\n## ")
	for _, typ := range []reflect.Type{reflect.TypeFor[rls.File](), reflect.TypeFor[rls.Descriptor](), reflect.TypeFor[rls.RateLimit](),
		reflect.TypeFor[rls.WindowSpec](), reflect.TypeFor[rls.BanSpec](), reflect.TypeFor[rls.Redis](), reflect.TypeFor[rls.TLS]()} {
		for f := range typ.Fields() {
			if name := f.Tag.Get("yaml"); !strings.Contains(sec, "`"+name+"`") && !strings.Contains(sec, "."+name+"`") {
				t.Errorf("docs/reference.md's Envoy's rate limit service section does not name %s's field `%s`", typ.Name(), name)
			}
		}
	}
}
