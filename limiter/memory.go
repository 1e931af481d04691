package limiter

import (
	"context"
	"hash/maphash"
	"sort"
	"sync"
	"time"
)

const memoryShards = 64

// MemoryStore is the in-process store: the same algorithms and the same
// answers as the Redis scripts, for one Caddy process. Keys of one identity
// (its regions and its global ceiling) live in one shard, under one lock, so
// a request is checked and recorded in all its buckets atomically.
//
// Memory is bounded by expiry: every state has the same expiry as its Redis
// key (sliding log: window + 1 s after its last write; sliding counter: two
// windows + 1 s; fixed window: the window's end + 1 s; token bucket: the time
// it is full again + 1 s). A request sees that expiry on its own clock; a
// janitor drops states whose time to live has passed on the wall clock,
// every second. Like the scripts' state, a state carries
// its own timestamps: expiry only reclaims memory, it never changes an answer.
// The sliding log holds one entry per unit in the window; the other
// algorithms hold a few integers per key.
type MemoryStore struct {
	now      func() time.Time
	seed     maphash.Seed
	shards   [memoryShards]memShard
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

type memShard struct {
	mu sync.Mutex
	m  map[string]*memState
}

// memState is one key's state: the fields of its algorithm are used.
type memState struct {
	expires     int64   // µs on the requests' clock
	wallExpires int64   // ns on the wall clock: when the janitor may drop it
	log         []int64 // sliding_log: admission times, ascending, one per unit
	// sliding_counter and fixed_window: the window index and the units in
	// it; sliding_counter also the units of the window before it.
	win, cur, prev int64
	tat            int64 // token_bucket: theoretical arrival time (µs)
}

// MemoryOption configures a MemoryStore.
type MemoryOption func(*MemoryStore)

// WithClock sets the clock used for requests whose Now is zero.
func WithClock(now func() time.Time) MemoryOption {
	return func(s *MemoryStore) { s.now = now }
}

// NewMemoryStore returns a store and starts its janitor; Close stops it.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	s := &MemoryStore{
		now:  time.Now,
		seed: maphash.MakeSeed(),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*memState)
	}
	go s.janitor(time.Second)
	return s
}

// Close stops the janitor. The store must not be used afterwards.
func (s *MemoryStore) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of keys held (expired ones included until swept).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Allow implements Store.
func (s *MemoryStore) Allow(_ context.Context, req *Request) (Result, error) {
	return s.decide(req, false)
}

// Peek implements Store.
func (s *MemoryStore) Peek(_ context.Context, req *Request) (Result, error) {
	return s.decide(req, true)
}

// Reset implements Store.
func (s *MemoryStore) Reset(_ context.Context, keys ...string) error {
	for _, k := range keys {
		sh := s.shard(k)
		sh.mu.Lock()
		delete(sh.m, k)
		sh.mu.Unlock()
	}
	return nil
}

func (s *MemoryStore) shard(key string) *memShard {
	tag := HashTag(key)
	if tag == "" {
		tag = key
	}
	return &s.shards[maphash.String(s.seed, tag)%memoryShards]
}

func (s *MemoryStore) decide(req *Request, peek bool) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	t := req.Now
	if t.IsZero() {
		t = s.now()
	}
	now := unixMicros(t)
	window := micros(req.Window)
	cost := req.cost()

	sh := s.shard(req.Bucket.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()

	n := 1
	if req.HasGlobal() {
		n = 2
	}
	var (
		states  [2]*memState
		buckets = [2]Bucket{req.Bucket, req.Global}
		evs     [2]keyEval
	)
	alg := req.Algorithm
	allowed := true
	for i := 0; i < n; i++ {
		st := sh.m[buckets[i].Key]
		if st != nil && st.expires <= now {
			// Redis would have dropped the key by now.
			st = nil
			delete(sh.m, buckets[i].Key)
		}
		states[i] = st
		evs[i] = check(alg, st, now, window, cost, buckets[i])
		if evs[i].retry > 0 {
			allowed = false
		}
	}
	if allowed && !peek {
		wall := time.Now().UnixNano()
		for i := 0; i < n; i++ {
			st := states[i]
			if st == nil {
				st = &memState{}
				sh.m[buckets[i].Key] = st
			}
			record(alg, st, &evs[i], now, window, cost)
			// The janitor works on the wall clock: the same time to live,
			// counted from now. (Requests may carry other clocks: tests, or
			// clock app on a skewed host; one limiter's clock must never
			// expire another's state.)
			st.wallExpires = wall + (st.expires-now)*int64(time.Microsecond)
		}
	}
	if alg == SlidingCounter {
		for i := 0; i < n; i++ {
			evs[i].counterReset(now)
		}
	}

	res := Result{Allowed: allowed}
	raw := &evs[0].rawUsage
	res.Bucket = usage(req.capacity(&req.Bucket), raw.count, raw.retry, raw.reset, raw.retry > 0)
	if n == 2 {
		raw = &evs[1].rawUsage
		res.Global = usage(req.capacity(&req.Global), raw.count, raw.retry, raw.reset, raw.retry > 0)
	}
	res.finish()
	return res, nil
}

// rawUsage mirrors one key's part of a script reply.
type rawUsage struct {
	count, retry, reset int64
}

// keyEval is one key's check, with what recording the request needs.
type keyEval struct {
	rawUsage
	counter counterKey // sliding_counter
	// fixed_window: window index and end; token_bucket: capacity, emission
	// interval and time until full. Floats, as in the scripts.
	win, end           float64
	burst, interval, d float64
}

// check evaluates one key as the algorithm's script does before writing:
// the key's usage before the request, and the retry time when it does not fit.
func check(alg Algorithm, st *memState, now, window, cost int64, b Bucket) keyEval {
	switch alg {
	case SlidingCounter:
		return checkCounter(st, now, window, cost, b.Limit)
	case FixedWindow:
		return checkFixed(st, now, window, cost, b.Limit)
	case TokenBucket:
		return checkToken(st, now, window, cost, b.Limit, b.Burst)
	default:
		return keyEval{rawUsage: checkLog(st, now, window, cost, b.Limit)}
	}
}

// record writes an admitted request into st, as the script does, and
// updates ev's usage to after the request.
func record(alg Algorithm, st *memState, ev *keyEval, now, window, cost int64) {
	switch alg {
	case SlidingCounter:
		recordCounter(st, ev, now, window, cost)
	case FixedWindow:
		recordFixed(st, ev, now, cost)
	case TokenBucket:
		recordToken(st, ev, now, cost)
	default:
		if ev.count == 0 {
			ev.reset = window
		}
		ev.count += cost
		recordLog(st, now, window, cost)
	}
}

// checkLog is sliding_log.lua's check for one key: it drops entries that
// left the window (as ZREMRANGEBYSCORE does) and reports the key's usage.
func checkLog(st *memState, now, window, cost, limit int64) rawUsage {
	var u rawUsage
	if st == nil {
		if cost > limit {
			u.retry = window
		}
		return u
	}
	// Window is (now - window, now]: drop entries <= now - window.
	cut := sort.Search(len(st.log), func(i int) bool { return st.log[i] > now-window })
	if cut > 0 {
		st.log = append(st.log[:0], st.log[cut:]...)
	}
	count := int64(len(st.log))
	u.count = count
	if count > 0 {
		u.reset = st.log[0] + window - now
	}
	if count+cost > limit {
		if cost > limit {
			u.retry = window
		} else {
			u.retry = st.log[count+cost-limit-1] + window - now
		}
	}
	return u
}

// recordLog adds cost entries at now, keeping the log sorted (requests may
// arrive with slightly out-of-order clocks), and refreshes the expiry.
func recordLog(st *memState, now, window, cost int64) {
	i := sort.Search(len(st.log), func(i int) bool { return st.log[i] > now })
	for c := int64(0); c < cost; c++ {
		st.log = append(st.log, 0)
	}
	copy(st.log[i+int(cost):], st.log[i:])
	for c := int64(0); c < cost; c++ {
		st.log[i+int(c)] = now
	}
	st.expires = now + ttlMicros(window)
}

// ttlMicros is the expiry the scripts set: window + 1 s, rounded up to a ms.
func ttlMicros(window int64) int64 {
	ms := (window + 999) / 1000
	return (ms + 1000) * 1000
}

func (s *MemoryStore) janitor(every time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.sweep()
		}
	}
}

// sweep drops every state whose time to live has passed on the wall clock.
// A request finds an expired state expired on its own clock anyway; the
// sweep only reclaims memory.
func (s *MemoryStore) sweep() {
	now := time.Now().UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			if st.wallExpires <= now {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}
