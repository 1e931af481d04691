package rls_test

import (
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

// messaging is envoyproxy/ratelimit's README example of nested keys: a
// marketing message to one number 5 a day, any message to one number 100
// a day, plus a shadow rule and an unlimited one.
const messaging = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: to_number
    value: "2061234567"
    detailed_metric: true
    rate_limit:
      unlimited: true
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
`

// TestEnvoyShapedConfigNestedKeys: a config in envoyproxy/ratelimit's
// shape loads; a nested descriptor (message_type=marketing, to_number=N)
// has its 5 a day per number, each number counted apart; the outer
// to_number rule its 100; OVER_LIMIT carries duration_until_reset; the
// unlimited value, an unmatched descriptor and another domain are OK
// without a limit.
func TestEnvoyShapedConfigNestedKeys(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := serve(t, messaging, clk)
	for i := range 5 {
		code, st := one(t, c, "messaging", desc("message_type", "marketing", "to_number", "111"))
		if code != ok || st.Code != ok || st.LimitRemaining != uint32(4-i) || st.CurrentLimit.GetRequestsPerUnit() != 5 ||
			st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_DAY {
			t.Fatalf("marketing %d: %v %v", i+1, code, st)
		}
	}
	code, st := one(t, c, "messaging", desc("message_type", "marketing", "to_number", "111"))
	if code != over || st.Code != over || st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() != 24*time.Hour {
		t.Fatalf("6th marketing message: %v %v, want OVER_LIMIT, 0 left, reset in 24h", code, st)
	}
	// Another number has its own 5.
	if code, st := one(t, c, "messaging", desc("message_type", "marketing", "to_number", "222")); code != ok || st.LimitRemaining != 4 {
		t.Fatalf("another number: %v %v", code, st)
	}
	// The outer rule is another budget: 100 a day.
	if code, st := one(t, c, "messaging", desc("to_number", "111")); code != ok || st.LimitRemaining != 99 || st.CurrentLimit.GetRequestsPerUnit() != 100 {
		t.Fatalf("to_number alone: %v %v", code, st)
	}
	for _, d := range []struct {
		domain string
		d      *rlv3.RateLimitDescriptor
		limit  bool
	}{
		{"messaging", desc("to_number", "2061234567"), false},
		{"messaging", desc("message_type", "transactional"), false},
		{"messaging", desc("message_type", "marketing"), false}, // a level without a rate_limit
		{"other", desc("to_number", "111"), false},
	} {
		code, st := one(t, c, d.domain, d.d)
		if code != ok || st.Code != ok || st.CurrentLimit != nil {
			t.Errorf("%s %v: %v %v, want OK without a limit", d.domain, d.d, code, st)
		}
	}
	// A day later the number has its 5 again.
	clk.Add(24 * time.Hour)
	if code, st := one(t, c, "messaging", desc("message_type", "marketing", "to_number", "111")); code != ok || st.LimitRemaining != 4 {
		t.Fatalf("a day later: %v %v", code, st)
	}
}

// TestOverLimitWhenAnyDescriptorIs: the overall code is OVER_LIMIT when one
// descriptor of several is over; each has its status, in order; a shadow
// rule over its limit stays OK and sends no headers.
func TestOverLimitWhenAnyDescriptorIs(t *testing.T) {
	t.Parallel()
	c := serve(t, messaging, newClock())
	req := &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("to_number", "333"), desc("shadow", "a")}}
	if resp := check(t, c, req); resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("first: %v", resp)
	}
	// The shadow rule is over its 1 a minute: still OK.
	resp := check(t, c, req)
	if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 98 || resp.Statuses[1].Code != ok {
		t.Fatalf("shadow over its limit: %v, want OK", resp)
	}
	if h := header(resp, "ratelimit"); h != `"messaging.to_number";r=98;t=86400` {
		t.Errorf("RateLimit %q: the shadow rule must add nothing", h)
	}
	// Over on one real descriptor: OVER_LIMIT overall, the other OK.
	for range 5 {
		check(t, c, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{desc("message_type", "marketing", "to_number", "333")}})
	}
	resp = check(t, c, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("to_number", "333"), desc("message_type", "marketing", "to_number", "333")}})
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over || header(resp, "retry-after") != "86400" {
		t.Fatalf("one of two over: %v", resp)
	}
}

// TestHitsAddend: the request's hits_addend is every descriptor's cost; a
// descriptor's own hits_addend replaces it, and 0 there checks without
// counting. A cost above what is left is OVER_LIMIT and spends nothing.
func TestHitsAddend(t *testing.T) {
	t.Parallel()
	c := serve(t, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`, newClock())
	req := func(hits uint32, d *rlv3.RateLimitDescriptor) *pb.RateLimitResponse_DescriptorStatus {
		resp := check(t, c, &pb.RateLimitRequest{Domain: "d", HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d}})
		return resp.Statuses[0]
	}
	for _, want := range []uint32{7, 4, 1} {
		if st := req(3, desc("user", "u")); st.Code != ok || st.LimitRemaining != want {
			t.Fatalf("hits 3: %v, want %d left", st, want)
		}
	}
	if st := req(3, desc("user", "u")); st.Code != over {
		t.Fatalf("hits 3 with 1 left: %v, want OVER_LIMIT", st)
	}
	peek := desc("user", "u")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if st := req(3, peek); st.Code != ok || st.LimitRemaining != 1 {
		t.Fatalf("hits_addend 0 (a check): %v, want OK with 1 left", st)
	}
	own := desc("user", "u")
	own.HitsAddend = wrapperspb.UInt64(1)
	if st := req(3, own); st.Code != ok || st.LimitRemaining != 0 {
		t.Fatalf("descriptor hits_addend 1 over the request's 3: %v", st)
	}
	if st := req(0, desc("user", "u")); st.Code != over || st.DurationUntilReset.AsDuration() != time.Minute {
		t.Fatalf("spent: %v, want OVER_LIMIT, reset in 1m", st)
	}
	// A cost above the limit never fits: OVER_LIMIT, on another key too.
	if st := req(11, desc("user", "v")); st.Code != over || st.CurrentLimit.GetRequestsPerUnit() != 10 {
		t.Fatalf("hits 11 on a limit of 10: %v, want OVER_LIMIT", st)
	}
	if st := req(1, desc("user", "v")); st.Code != ok || st.LimitRemaining != 9 {
		t.Fatalf("after a cost that never fits: %v, want nothing spent", st)
	}
}

// TestLimitOverride: a descriptor's own limit (Envoy's limit override)
// replaces the configuration's, per unit, counted apart from it.
func TestLimitOverride(t *testing.T) {
	t.Parallel()
	c := serve(t, messaging, newClock())
	d := desc("to_number", "444")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	for i := range 2 {
		if code, st := one(t, c, "messaging", d); code != ok || st.LimitRemaining != uint32(1-i) ||
			st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("override %d: %v %v", i+1, code, st)
		}
	}
	if code, st := one(t, c, "messaging", d); code != over || st.DurationUntilReset.AsDuration() != time.Minute {
		t.Fatalf("3rd under an override of 2/minute: %v %v", code, st)
	}
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	ctx := t.Context()
	_, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("override of 0: %v, want InvalidArgument", err)
	}
}

// TestEngineExtensions: several windows (the tightest reported), a ban
// (refused for its length after its denials, past the window), a region
// budget under a global ceiling, and the IETF headers of them.
func TestEngineExtensions(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := serve(t, `
domain: api
algorithm: sliding_counter
descriptors:
  - key: key
    rate_limit:
      name: api
      algorithm: sliding_log
      unit: second
      requests_per_unit: 2
      windows: [{requests_per_unit: 3, window: 1m}]
      ban: {after: 2, within: 1m, for: 10m}
  - key: tenant
    descriptors:
      - key: dc
        rate_limit:
          region_key: dc
          unit: minute
          requests_per_unit: 3
          global: [{requests_per_unit: 4, unit: minute}]
`, clk)
	resp := check(t, c, &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("key", "k")}})
	if h := header(resp, "ratelimit-policy"); h != `"api-1s";q=2;w=1, "api-1m";q=3;w=60` {
		t.Errorf("RateLimit-Policy %q", h)
	}
	if h := header(resp, "ratelimit"); h != `"api-1s";r=1;t=1, "api-1m";r=2;t=60` {
		t.Errorf("RateLimit %q", h)
	}
	one(t, c, "api", desc("key", "k"))
	clk.Add(time.Second)
	if _, st := one(t, c, "api", desc("key", "k")); st.Code != ok || st.LimitRemaining != 0 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("3rd in a minute: %v, want the minute window's 0 left", st)
	}
	for i := range 2 { // two denials: the ban
		if _, st := one(t, c, "api", desc("key", "k")); st.Code != over {
			t.Fatalf("denial %d: %v", i+1, st)
		}
	}
	clk.Add(2 * time.Minute)
	if _, st := one(t, c, "api", desc("key", "k")); st.Code != over || st.DurationUntilReset.AsDuration() != 8*time.Minute {
		t.Fatalf("banned, past the window: %v, want OVER_LIMIT until the ban ends", st)
	}
	// Regions: 3 a minute each, 4 across them.
	admitted := 0
	for _, dc := range []string{"eu", "us", "eu", "us", "eu", "us"} {
		if _, st := one(t, c, "api", desc("tenant", "t", "dc", dc)); st.Code == ok {
			admitted++
		}
	}
	if admitted != 4 {
		t.Fatalf("%d admitted across two regions of 3 under a ceiling of 4", admitted)
	}
}

// TestBadRequestsAnswerErrors: no descriptors, an entry without a key,
// nil entries: an error or OK, never a panic.
func TestBadRequestsAnswerErrors(t *testing.T) {
	t.Parallel()
	c := serve(t, messaging, nil)
	ctx := t.Context()
	if _, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "messaging"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no descriptors: %v", err)
	}
	if _, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{desc("", "x")}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty key: %v", err)
	}
	resp, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{{}}})
	if err != nil || resp.OverallCode != ok {
		t.Errorf("a descriptor without entries: %v %v", resp, err)
	}
	long := desc("to_number", string(make([]byte, 4096)))
	if code, st := one(t, c, "messaging", long); code != ok || st.LimitRemaining != 99 {
		t.Errorf("a 4 KiB value of NULs: %v %v", code, st)
	}
}

// TestUnits: every unit of the API loads and comes back as the status's
// unit, with its window as the reset of a first request (sliding_log: the
// request leaves the window that long after); month is the calendar
// month (the reset: the month's end).
func TestUnits(t *testing.T) {
	t.Parallel()
	for _, u := range []struct {
		unit  string
		want  pb.RateLimitResponse_RateLimit_Unit
		reset time.Duration
	}{
		{"second", pb.RateLimitResponse_RateLimit_SECOND, time.Second},
		{"minute", pb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
		{"hour", pb.RateLimitResponse_RateLimit_HOUR, time.Hour},
		{"DAY", pb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
		{"week", pb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
		{"month", pb.RateLimitResponse_RateLimit_MONTH, 29*24*time.Hour + 14*time.Hour}, // from 2 March 10:00 to 1 April
		{"year", pb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
	} {
		c := serve(t, "domain: u\ndescriptors: [{key: k, rate_limit: {unit: "+u.unit+", requests_per_unit: 3}}]", newClock())
		_, st := one(t, c, "u", desc("k", "v"))
		if st.CurrentLimit.GetUnit() != u.want || st.LimitRemaining != 2 || st.DurationUntilReset.AsDuration() != u.reset {
			t.Errorf("unit %s: %v, want %v, 2 left, reset in %v", u.unit, st, u.want, u.reset)
		}
	}
}
