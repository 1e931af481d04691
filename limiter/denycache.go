package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDenyCacheSize is the default bound on cached denials.
const DefaultDenyCacheSize = 65536

// DenyCache is a Store in front of another: once the store denies a request
// until R, later requests of the same key and shape (limits, cost, windows,
// ban rule) are denied locally until R has passed, without a store call.
// That keeps a client hammering past its limit off Redis entirely.
//
// It never denies what the store would admit: nothing but time makes room
// in a window (admissions only add), R is the latest retry time of the
// windows that denied (or the ban's end), measured from before the store
// call, and a cached denial is used only for a request of the same shape.
// (Known exception: a token bucket whose nodes hold different limits, a
// reload half-way, where a node of a faster rate records in the state and
// a node of a slower rate then reads it draining faster than real time:
// docs/decision.md, state under another policy.)
// An admission of another shape (a smaller cost) drops the key's cached
// denial. A cached answer says only what it knows: the windows that denied,
// with their retry time counted down; the others are Unknown.
//
// Under a ban rule every refusal by a window counts toward the ban, in the
// store, at its time, whichever node made it: so while the store answers,
// such a request goes on to it (the store refuses it again, and counts it);
// only a ban is served from the cache (a banned key's requests count for
// nothing). When the store cannot answer, a cached denial that still holds
// is served, ban rule or not: the store would deny it too. (Those refusals
// are not counted toward the ban: no store saw them.) The cost to the store
// is bounded by the ban itself: a key is refused about After times per
// Within before it is banned, and its ban is then served locally.
//
// Forget drops the denials of one identity (an operator's reset, a lifted
// ban, on this process or, through a Notifier, on another); a denial
// decided before a Forget is never cached after it. Memory is bounded: at
// most size entries, expired ones dropped first.
type DenyCache struct {
	store Store
	now   func() time.Time
	max   int64
	// m maps a key to its denial. A sync.Map: the hot path is many cores
	// reading one hot key's entry, which takes no lock here.
	m     sync.Map
	size  atomic.Int64
	gen   atomic.Uint64
	evict sync.Mutex // one evictor at a time
	// forgetting is held by a Forget while it drops its denials: a denial
	// served through an outage is one no Forget has dropped, or is
	// dropping.
	forgetting sync.RWMutex
}

type denial struct {
	start, until int64 // ns, local clock
	shape        uint64
	reply        Reply
}

// NewDenyCache puts a cache of at most size denials in front of store.
// now is the clock of the cached deadlines (default time.Now).
func NewDenyCache(store Store, size int, now func() time.Time) *DenyCache {
	if size <= 0 {
		size = DefaultDenyCacheSize
	}
	if now == nil {
		now = time.Now
	}
	return &DenyCache{store: store, now: now, max: int64(size)}
}

// Len returns the number of cached denials (expired ones included until
// they are pushed out).
func (c *DenyCache) Len() int { return int(c.size.Load()) }

// Reset implements Store: it forgets the keys' identities, then resets the
// keys in the store.
func (c *DenyCache) Reset(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		c.Forget(HashTag(k))
	}
	return c.store.Reset(ctx, keys...)
}

// Do implements Store. A denial served from the cache has Cached set.
func (c *DenyCache) Do(ctx context.Context, op *Op) (Reply, error) {
	if op.Mode != ModeCheck && op.Mode != ModeCheckOnly {
		return c.store.Do(ctx, op)
	}
	start := c.now().UnixNano()
	key := op.Parts[0].Key
	shape := opShape(op)
	var held *denial // a denial of this shape that holds, not served
	v, cached := c.m.Load(key)
	if cached {
		d := v.(*denial)
		switch {
		case start >= d.until:
			c.drop(key, d)
			cached = false
		case d.shape == shape:
			if op.Ban == nil || d.reply.Status == StatusBanned {
				return d.at(start, op), nil
			}
			held = d // the ban counts this refusal: the store decides it
		}
	}

	gen := c.gen.Load()
	res, err := c.store.Do(ctx, op)
	if err != nil {
		if held != nil {
			// The store is down, and it would deny this request still,
			// unless a Forget of this identity dropped the denial meanwhile
			// (one of another identity leaves it: it is still the map's).
			c.forgetting.RLock()
			v, ok := c.m.Load(key)
			c.forgetting.RUnlock()
			if ok && v == held {
				return held.at(start, op), nil
			}
		}
		return res, err
	}
	if res.Status == StatusAllowed {
		if cached {
			// A request of another shape got in: a cached denial of this
			// key would now overstate what is used.
			c.drop(key, nil)
		}
		return res, nil
	}
	until := start + retryOf(&res)*int64(time.Microsecond)
	if res.Share&ShareShort != 0 {
		// A share of a global ceiling may be renewed any time, by any node:
		// its denials are not cached.
		until = start
	}
	if until <= start {
		return res, nil // a lease denial: no retry time to cache
	}
	d := &denial{start: start, until: until, shape: shape, reply: res}
	if _, loaded := c.m.Swap(key, d); !loaded {
		if c.size.Add(1) > c.max {
			c.shrink(start, key)
		}
	}
	if c.gen.Load() != gen {
		// A Forget ran while the store decided: this denial may predate it.
		c.drop(key, d)
	}
	return res, nil
}

// retryOf is the time (µs) until the store could admit the request again:
// the latest retry time of the windows that denied it, or the ban's end.
// 0 for a denial with no such time (the concurrency bound).
func retryOf(r *Reply) int64 {
	var t int64
	if r.LeaseDenied {
		return 0
	}
	for _, u := range r.Usage {
		t = max(t, u.Retry)
	}
	if r.Status == StatusBanned {
		t = max(t, r.BanLeft)
	}
	return t
}

// at is the cached denial as of now: the windows that denied with their
// retry time counted down, the others Unknown. Its usage is in op's reply
// buffer (see usageFor) when that is free.
func (d *denial) at(now int64, op *Op) Reply {
	e := (now - d.start) / int64(time.Microsecond)
	n := len(d.reply.Usage)
	r := Reply{
		Status: d.reply.Status, Now: d.reply.Now + e, Cached: true, InFlight: -1,
		Usage:  op.usageFor(n)[:n],
		Limits: d.reply.Limits, Bursts: d.reply.Bursts,
	}
	if d.reply.BanLeft > e {
		r.BanLeft = d.reply.BanLeft - e
	}
	for i, u := range d.reply.Usage {
		r.Usage[i] = Usage{Unknown: true}
		if u.Retry > e {
			r.Usage[i].Retry = u.Retry - e
		}
	}
	return r
}

// drop removes key's denial (only if it is still d, when d is given).
func (c *DenyCache) drop(key string, d *denial) {
	var deleted bool
	if d != nil {
		deleted = c.m.CompareAndDelete(key, d)
	} else {
		_, deleted = c.m.LoadAndDelete(key)
	}
	if deleted {
		c.size.Add(-1)
	}
}

// shrink brings the cache back under its bound: expired denials first,
// then arbitrary ones, never the one just added (keep).
func (c *DenyCache) shrink(now int64, keep string) {
	if !c.evict.TryLock() {
		return // another request is at it
	}
	defer c.evict.Unlock()
	c.m.Range(func(k, v any) bool {
		if d := v.(*denial); now >= d.until {
			c.drop(k.(string), d)
		}
		return true
	})
	c.m.Range(func(k, v any) bool {
		if c.size.Load() <= c.max*9/10 {
			return false
		}
		if k.(string) != keep {
			c.drop(k.(string), v.(*denial))
		}
		return true
	})
}

// Forget drops the cached denials of one identity (its hash tag), or of
// every key when tag is "". A denial decided before Forget returned is not
// cached after it.
func (c *DenyCache) Forget(tag string) {
	c.forget(func(t string) bool { return tag == "" || t == tag })
}

// forgetTags is Forget for several identities at once (one pass).
func (c *DenyCache) forgetTags(tags map[string]bool) {
	c.forget(func(t string) bool { return tags[t] })
}

// forget drops the denials whose identity's hash tag matches; a denial
// decided before it is never cached after it (the generation moves on).
func (c *DenyCache) forget(match func(tag string) bool) {
	c.forgetting.Lock()
	defer c.forgetting.Unlock()
	c.gen.Add(1)
	c.m.Range(func(k, v any) bool {
		if match(HashTag(k.(string))) {
			c.drop(k.(string), v.(*denial))
		}
		return true
	})
}

// opShape hashes everything of an Op that changes its answer, except the
// time: mode, cost, keys, kinds, windows, limits, bursts, the ban rule,
// the concurrency bound and the overrides read (FNV-1a over whole words, each step folded: the
// numbers, the strings 8 bytes at a time and their tails byte by byte, no
// allocation). It is compared only with shapes of this process.
//
// A calendar period's bounds are the time's, and left out: a denial holds
// into the next period until its retry time, which is the end of the
// period for a period that denied, and a window's that still denies
// otherwise (the store would refuse the request until then). With them in,
// a key denied by a duration window across a period's end was not served
// from the cache, and during an outage followed the fail mode instead
// (fail open let it through).
func opShape(op *Op) uint64 {
	h := uint64(14695981039346656037)
	num := func(v int64) {
		h ^= uint64(v)
		h *= 1099511628211
		h ^= h >> 29
	}
	str := func(s string) {
		i := 0
		for ; i+8 <= len(s); i += 8 {
			num(int64(uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
				uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56))
		}
		for ; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
		num(int64(len(s)))
	}
	num(int64(op.Mode))
	num(op.Cost)
	for i := range op.Parts {
		p := &op.Parts[i]
		str(p.Key)
		num(int64(p.Kind))
		for j := range p.Windows {
			w := &p.Windows[j]
			str(w.Name)
			num(w.Limit)
			num(w.Burst)
		}
	}
	if b := op.Ban; b != nil {
		str(b.Key)
		num(b.After)
		num(b.Within)
		num(b.For)
	}
	if l := op.Lease; l != nil {
		num(l.Max)
		num(l.Timeout)
	}
	// A request that reads its identity's overrides is decided by them: a
	// denial decided without them (before this node learnt of one) must
	// not answer it, nor the other way round.
	if o := op.Override; o != nil {
		str(o.Key)
		str(o.Scope)
	}
	return h
}
