// Package rls is Envoy's rate limit service on this engine: the v3 gRPC
// API (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), a
// YAML configuration in envoyproxy/ratelimit's shape extended with the
// engine's algorithms, windows, bans and global ceiling, on Redis or in
// this process.
//
// Per request descriptor it finds the rule of the descriptor tree, maps
// the descriptor to the engine's Input (identity: the entries; region:
// the region_key entry; cost: hits_addend; limit: the descriptor's
// override) and the engine's Decision to a DescriptorStatus and the
// response headers (internal/reply's renderer): nothing of the decision is
// its own.
package rls

import (
	"context"
	"errors"
	"fmt"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/defaults"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redisconf"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Options are what a configuration file does not say.
type Options struct {
	// Now is the clock of clock: app and of the in-process store (tests
	// move it). Default time.Now.
	Now func() time.Time
	// Namespace starts the metric names ("" : sliding_ratelimit_...).
	Namespace string
	// Metrics, when set, counts this service's decisions beside others'
	// (several domains in one process); otherwise the service has its own
	// (Collectors).
	Metrics *Metrics
}

// Metrics are the collectors of the services given them: the Caddy
// handler's series, labelled by rule (limiter). Make one per process and
// register its Collectors.
type Metrics struct {
	set  *limitmetrics.Set
	mu   sync.Mutex
	live map[*Service]struct{}
}

// NewMetrics makes the collectors; names start with namespace (may be "").
func NewMetrics(namespace string) *Metrics {
	m := &Metrics{live: map[*Service]struct{}{}}
	m.set = limitmetrics.NewSet(namespace, m.sources)
	return m
}

// Collectors are the collectors to register.
func (m *Metrics) Collectors() []prometheus.Collector { return m.set.Collectors() }

func (m *Metrics) sources() []limitmetrics.Source {
	m.mu.Lock()
	live := make([]*Service, 0, len(m.live))
	for s := range m.live {
		live = append(live, s)
	}
	m.mu.Unlock()
	var out []limitmetrics.Source
	for _, s := range live {
		out = append(out, s.sources()...)
	}
	return out
}

// DefaultWarnAt is the share of a limit at which an admitted request
// counts in near_limit_total.
const DefaultWarnAt = defaults.WarnAt

// Service answers ShouldRateLimit for one configuration. Close releases
// its stores.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	file    *File
	root    *node
	rules   []*rule
	base    limiter.Policy
	backend limiter.Backend
	global  *limiter.Global // the ledger, when global_redis is set
	breaker *limiter.Breaker
	memory  *limiter.MemoryStore
	store   string
	headers string
	set     *limitmetrics.Set
	metrics *Metrics
	closers []func() error

	mu        sync.Mutex
	overrides map[overrideKey]*rule // the rules of RateLimitDescriptor.limit
	closed    bool
}

// overrideKey is a rule of RateLimitDescriptor.limit: one per unit and
// algorithm.
type overrideKey struct {
	w   limiter.Window
	alg limiter.Algorithm
}

// Load reads and checks a configuration and builds its service.
func Load(data []byte, opts Options) (*Service, error) {
	f, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return New(f, opts)
}

// New checks f and builds its service. It does not wait for Redis: until
// it answers, requests follow the fail mode.
func New(f *File, opts Options) (*Service, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Service{file: f, headers: cmpOr(f.Headers, "ietf"), store: "memory", overrides: map[overrideKey]*rule{}}
	fail, _ := limiter.ParseFailMode(cmpOr(f.Fail, defaults.Fail))
	s.base = limiter.Policy{Fail: fail, AppClock: f.Clock == "app", Now: opts.Now}
	var rc, lc *redisconf.Config
	var err error
	if f.Redis != nil {
		if rc, err = f.Redis.storeConfig("redis"); err != nil {
			return nil, err
		}
		if e := rc.Check(); e != nil {
			return nil, redisErr("redis", e)
		}
		s.base.KeyPrefix, s.base.Timeout = rc.KeyPrefix, rc.DecisionTimeout()
	}
	if f.GlobalRedis != nil {
		if lc, err = f.GlobalRedis.storeConfig("global_redis"); err != nil {
			return nil, err
		}
		if e := lc.CheckLedger(); e != nil {
			return nil, redisErr("global_redis", e)
		}
	}
	if s.root, s.rules, err = f.compile(s.base); err != nil {
		return nil, err
	}
	if err := s.open(rc, lc); err != nil {
		s.close()
		return nil, err
	}
	s.metrics = opts.Metrics
	if s.metrics == nil {
		s.metrics = NewMetrics(opts.Namespace)
	}
	s.set = s.metrics.set
	s.metrics.mu.Lock()
	s.metrics.live[s] = struct{}{}
	s.metrics.mu.Unlock()
	for _, r := range s.rules {
		if err := s.start(r); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// open opens the stores: Redis (rc) or this process's, and the ledger
// (lc) when set.
func (s *Service) open(rc, lc *redisconf.Config) error {
	if rc == nil {
		mem := limiter.NewMemoryStore()
		s.closers = append(s.closers, mem.Close)
		s.backend, s.memory = limiter.Backend{Store: mem, Source: limiter.SourceMemory, Notifier: mem}, mem
	} else {
		st, err := rc.OpenStore(nil)
		if err != nil {
			return errAt("redis", "%v", err)
		}
		s.closers = append(s.closers, st.Close)
		s.backend = limiter.Backend{Store: st.Breaker, Base: st.Store, Source: limiter.SourceRedis, Remote: true,
			DenyCacheSize: s.file.DenyCacheSize, Notifier: st.Store}
		s.breaker, s.store = st.Breaker, "redis"
		if s.file.Fail == "local" {
			mem := limiter.NewMemoryStore()
			s.closers = append(s.closers, mem.Close)
			s.backend.Local, s.memory = mem, mem
		}
	}
	if lc != nil {
		client, _, ledger, err := lc.OpenLedger()
		if err != nil {
			return errAt("global_redis", "%v", err)
		}
		s.closers = append(s.closers, client.Close)
		s.global = &limiter.Global{Ledger: ledger, Datacenter: s.file.Datacenter, Timeout: lc.LedgerTimeout()}
	}
	return nil
}

// start builds a rule's limiter on the service's stores.
func (s *Service) start(r *rule) error {
	b := s.backend
	r.metrics = s.set.Limiter(r.name, s.store)
	if s.global != nil && len(r.policy.GlobalWindows) > 0 {
		g := *s.global
		r.metrics.Global = s.set.Global(r.name, s.file.Datacenter, r.policy.GlobalWindows)
		g.OnEvent = r.metrics.GlobalEvent
		b.Global = &g
	}
	lim, err := limiter.New(r.policy, b)
	if err != nil {
		return policyErr(r.path, nil, nil, err)
	}
	r.lim = lim
	r.plan = reply.NewPlan(s.headers, r.shadow, "")
	return nil
}

// Collectors are the metrics' collectors, to register (those of
// Options.Metrics when it was given: register them once).
func (s *Service) Collectors() []prometheus.Collector { return s.set.Collectors() }

// Domain is the domain the service answers.
func (s *Service) Domain() string { return s.file.Domain }

// names are the limiter names of the service's rules.
func (s *Service) names() []string {
	out := make([]string, 0, len(s.rules))
	for _, r := range s.rules {
		out = append(out, r.name)
	}
	return out
}

func (s *Service) sources() []limitmetrics.Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]limitmetrics.Source, 0, len(s.rules)+len(s.overrides))
	add := func(r *rule) {
		out = append(out, limitmetrics.Source{Name: r.name, Lim: r.lim, Global: r.metrics.Global, Breaker: s.breaker, Memory: s.memory})
	}
	for _, r := range s.rules {
		add(r)
	}
	for _, r := range s.overrides {
		add(r)
	}
	return out
}

// Close stops the limiters and closes the stores.
func (s *Service) Close() error {
	if s.metrics != nil {
		s.metrics.mu.Lock()
		delete(s.metrics.live, s)
		s.metrics.mu.Unlock()
	}
	s.mu.Lock()
	s.closed = true
	for _, r := range s.rules {
		if r.lim != nil {
			r.lim.Close()
		}
	}
	for _, r := range s.overrides {
		r.lim.Close()
	}
	s.mu.Unlock()
	return s.close()
}

func (s *Service) close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// ShouldRateLimit decides every descriptor of the request: OVER_LIMIT
// overall when any is over its limit (a shadow_mode rule never is).
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	hdr := http.Header{}
	for i, desc := range req.Descriptors {
		st, err := s.descriptor(ctx, req, desc, hdr)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	resp.ResponseHeadersToAdd = headerValues(hdr)
	return resp, nil
}

// descriptor decides one descriptor.
func (s *Service) descriptor(ctx context.Context, req *pb.RateLimitRequest, desc *rlv3.RateLimitDescriptor, hdr http.Header) (*pb.RateLimitResponse_DescriptorStatus, error) {
	ok := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	if req.Domain != s.file.Domain || desc == nil {
		return ok, nil
	}
	for _, e := range desc.Entries {
		if e == nil || e.Key == "" {
			return nil, errors.New("an entry has an empty key")
		}
	}
	cost := int64(req.HitsAddend)
	peek := false
	if h := desc.HitsAddend; h != nil {
		cost, peek = int64(min(h.Value, uint64(limiter.MaxValue))), h.Value == 0
	}
	if cost == 0 {
		cost = 1
	}
	var r *rule
	var limits []int64
	if o := desc.GetLimit(); o != nil {
		var err error
		if r, err = s.override(o); err != nil {
			return nil, err
		}
		limits = []int64{int64(o.RequestsPerUnit)}
	} else if r = s.root.match(desc.Entries); r == nil || r.unlimited {
		if r != nil {
			ok.LimitRemaining = math.MaxUint32
		}
		return ok, nil
	} else {
		limits = r.limits
	}
	in := limiter.Input{Identity: identity(desc.Entries, r.region), Limits: limits, GlobalLimits: r.globals, Cost: cost}
	if r.region != "" {
		in.Region = entryValue(desc.Entries, r.region)
	}
	var d limiter.Decision
	var err error
	if peek {
		d, err = r.lim.Peek(ctx, &in)
	} else {
		d, err = r.lim.Decide(ctx, &in)
	}
	if err != nil {
		return nil, err
	}
	if !peek {
		r.metrics.Count(&d, DefaultWarnAt)
	}
	r.render(hdr, &d)
	return r.status(&d), nil
}

// override is the rule of a descriptor's own limit: one per unit, made at
// its first use, with the file's algorithm.
func (s *Service) override(o *rlv3.RateLimitDescriptor_RateLimitOverride) (*rule, error) {
	if o.RequestsPerUnit < 1 {
		return nil, errors.New("limit.requests_per_unit must be at least 1")
	}
	name, ok := typev3.RateLimitUnit_name[int32(o.Unit)]
	var w limiter.Window
	if ok {
		w, ok = units[strings.ToLower(name)]
	}
	if !ok {
		return nil, fmt.Errorf("limit.unit %v has no window here: want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", o.Unit)
	}
	p := s.base
	if s.file.Algorithm != "" {
		p.Algorithm, _ = limiter.ParseAlgorithm(s.file.Algorithm)
	}
	if p.Algorithm == limiter.SlidingLog && w.Period == limiter.PeriodNone && int64(o.RequestsPerUnit) > limiter.MaxLogEntries {
		// A log keeps at most MaxLogEntries per key: above, the counter.
		p.Algorithm = limiter.SlidingCounter
	}
	key := overrideKey{w, p.Algorithm}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.overrides[key]; r != nil {
		return r, nil
	}
	if s.closed {
		return nil, errors.New("the service is closed")
	}
	p.Windows = []limiter.Window{w}
	if w.Period != limiter.PeriodNone {
		p.Location = time.UTC
	}
	r := &rule{path: s.file.Domain + ".override." + strings.ToLower(name) + "." + p.Algorithm.String()}
	r.name = hashedName(r.path)
	p.Name = r.name
	r.policy = p
	if err := s.start(r); err != nil {
		return nil, err
	}
	s.overrides[key] = r
	return r, nil
}

// render adds the decision's rate limit headers: IETF RateLimit and
// RateLimit-Policy (accumulating over the descriptors), X-RateLimit-* of
// the tightest window, Retry-After on a denial.
func (r *rule) render(hdr http.Header, d *limiter.Decision) {
	switch {
	case !d.Pass:
		var refusals reply.Refusals
		st, _, retry := refusals.Of(d)
		if prev := hdr.Get(reply.HdrRetry); prev != "" && st == http.StatusTooManyRequests {
			if p, err := strconv.ParseInt(prev, 10, 64); err == nil && p > reply.RetryAfterSeconds(d) {
				retry = prev
			}
		}
		r.plan.SetHeaders(hdr, d, st, retry, nil)
	case d.Outcome != limiter.OutcomeUnavailable:
		r.plan.Write(hdr, d)
	}
}

// status is the decision's DescriptorStatus: OVER_LIMIT when it refused
// the request; the tightest window's limit, remaining and time until
// more quota comes back (until the request would be admitted, on a
// refusal).
func (r *rule) status(d *limiter.Decision) *pb.RateLimitResponse_DescriptorStatus {
	st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	if !d.Pass {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
	t := d.Tightest()
	if t == nil && len(d.Windows) > 0 && !d.Pass {
		t = &d.Windows[0]
	}
	if t == nil {
		return st
	}
	st.CurrentLimit = &pb.RateLimitResponse_RateLimit{Name: r.name, RequestsPerUnit: clamp32(t.Limit), Unit: unitOf(t.Window)}
	st.LimitRemaining = clamp32(t.Remaining)
	reset := t.Reset
	if !d.Pass {
		st.LimitRemaining, reset = 0, d.RetryAfter
	}
	st.DurationUntilReset = durationpb.New(reset)
	return st
}

func clamp32(n int64) uint32 {
	if n < 0 {
		return 0
	}
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}

// unitOf is the API's unit of a window; UNKNOWN for a window of no unit.
func unitOf(w limiter.Window) pb.RateLimitResponse_RateLimit_Unit {
	switch {
	case w.Period == limiter.PeriodMonth:
		return pb.RateLimitResponse_RateLimit_MONTH
	case w.Period != limiter.PeriodNone:
		return pb.RateLimitResponse_RateLimit_UNKNOWN
	}
	for name, u := range units {
		if u == w {
			return pb.RateLimitResponse_RateLimit_Unit(pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(name)])
		}
	}
	return pb.RateLimitResponse_RateLimit_UNKNOWN
}

// headerValues are hdr's headers, lower-case names in order.
func headerValues(hdr http.Header) []*corev3.HeaderValue {
	if len(hdr) == 0 {
		return nil
	}
	names := make([]string, 0, len(hdr))
	for k := range hdr {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]*corev3.HeaderValue, 0, len(names))
	for _, k := range names {
		out = append(out, &corev3.HeaderValue{Key: strings.ToLower(k), Value: strings.Join(hdr[k], ", ")})
	}
	return out
}

// match is the rule of a descriptor's entries: at each level the entry's
// key and value, else a value prefix ("value: api*"), else its key alone
// (every value); nil when an entry matches nothing or the last level has
// no rate limit.
func (n *node) match(entries []*rlv3.RateLimitDescriptor_Entry) *rule {
	for _, e := range entries {
		next := n.next[e.Key+"_"+e.Value]
		if next == nil {
			for _, p := range n.prefixes {
				if p.key == e.Key && strings.HasPrefix(e.Value, p.prefix) {
					next = p.node
					break
				}
			}
		}
		if next == nil {
			next = n.next[e.Key]
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n.rule
}

// identity is whose budget a descriptor spends: its entries but the
// region's, key=value joined by '|'. A key or value with '|', '=', '"' or
// '\' is quoted, so two descriptors never share an identity.
func identity(entries []*rlv3.RateLimitDescriptor_Entry, region string) string {
	var b strings.Builder
	for _, e := range entries {
		if region != "" && e.Key == region {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		b.WriteString(quoted(e.Key))
		b.WriteByte('=')
		b.WriteString(quoted(e.Value))
	}
	return b.String()
}

func quoted(s string) string {
	if strings.ContainsAny(s, "|=\"\\") {
		return strconv.Quote(s)
	}
	return s
}

func entryValue(entries []*rlv3.RateLimitDescriptor_Entry, key string) string {
	for _, e := range entries {
		if e.Key == key {
			return e.Value
		}
	}
	return ""
}
