package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDenyCacheSize is the default bound on cached denials.
const DefaultDenyCacheSize = 65536

const denyShards = 32

// DenyCache is a Store in front of another: once the store denies a key
// with retry-after R, later requests for the same key, limit and cost are
// denied locally until R has passed, with the exact remaining retry time
// and no call to the store. That keeps a client hammering past its limit
// off Redis entirely.
//
// It never denies what the store would admit: nothing but time makes room
// in a bucket (admissions only add), the cached deadline is measured from
// before the store call, and a cached denial is used only for the same
// bucket, limit, global ceiling and cost. An admission to the bucket (a
// smaller cost) drops its cached denial, so the retry time stays exact. One
// case under-states the wait: a denial cached for a bucket with a global
// ceiling, when other regions of the identity then fill the ceiling; the
// client then asks again early and the store answers with the new time.
// Reset drops the key's denials. Memory is bounded: at most size entries,
// expired ones dropped first.
type DenyCache struct {
	store  Store
	now    func() time.Time
	seed   maphash.Seed
	perMax int
	shards [denyShards]denyShard
	hits   atomic.Int64
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denial
}

type denial struct {
	until       time.Time
	limit       int64
	globalKey   string
	globalLimit int64
	cost        int64
	res         Result
}

// NewDenyCache puts a cache of at most size denials in front of store.
// now is the clock used for requests whose Now is zero.
func NewDenyCache(store Store, size int, now func() time.Time) *DenyCache {
	if size <= 0 {
		size = DefaultDenyCacheSize
	}
	if now == nil {
		now = time.Now
	}
	c := &DenyCache{store: store, now: now, seed: maphash.MakeSeed(), perMax: max(size/denyShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denial)
	}
	return c
}

// Hits returns the number of requests denied from the cache.
func (c *DenyCache) Hits() int64 { return c.hits.Load() }

// Len returns the number of cached denials (expired ones included until
// they are pushed out).
func (c *DenyCache) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Allow implements Store. A denial served from the cache has Cached set.
func (c *DenyCache) Allow(ctx context.Context, req *Request) (Result, error) {
	start := req.Now
	if start.IsZero() {
		start = c.now()
	}
	sh := c.shard(req.Bucket.Key)
	sh.mu.Lock()
	d, ok := sh.m[req.Bucket.Key]
	if ok && !start.Before(d.until) {
		delete(sh.m, req.Bucket.Key)
		ok = false
	}
	sh.mu.Unlock()
	if ok && d.matches(req) {
		c.hits.Add(1)
		return d.result(start), nil
	}

	res, err := c.store.Allow(ctx, req)
	if err != nil || (!ok && res.Allowed) || (!res.Allowed && res.RetryAfter <= 0) {
		return res, err
	}
	sh.mu.Lock()
	if res.Allowed {
		// A request of another cost (or without the global ceiling) got
		// in: a cached denial of this bucket would now under-state the wait.
		delete(sh.m, req.Bucket.Key)
		sh.mu.Unlock()
		return res, nil
	}
	if len(sh.m) >= c.perMax {
		sh.evict(start, c.perMax)
	}
	sh.m[req.Bucket.Key] = denial{
		until:       start.Add(res.RetryAfter),
		limit:       req.Bucket.Limit,
		globalKey:   req.Global.Key,
		globalLimit: req.Global.Limit,
		cost:        req.cost(),
		res:         res,
	}
	sh.mu.Unlock()
	return res, nil
}

// Peek implements Store; it always asks the store.
func (c *DenyCache) Peek(ctx context.Context, req *Request) (Result, error) {
	return c.store.Peek(ctx, req)
}

// Reset implements Store: it drops the keys' cached denials, then resets
// them in the store.
func (c *DenyCache) Reset(ctx context.Context, keys ...string) error {
	c.Forget(keys...)
	return c.store.Reset(ctx, keys...)
}

// Forget drops cached denials of the given keys, or of every key when none
// is given.
func (c *DenyCache) Forget(keys ...string) {
	if len(keys) == 0 {
		for i := range c.shards {
			sh := &c.shards[i]
			sh.mu.Lock()
			clear(sh.m)
			sh.mu.Unlock()
		}
		return
	}
	for _, k := range keys {
		sh := c.shard(k)
		sh.mu.Lock()
		delete(sh.m, k)
		sh.mu.Unlock()
	}
}

func (c *DenyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%denyShards]
}

// evict makes room for one more: expired denials first, then arbitrary
// ones (map order is random).
func (sh *denyShard) evict(now time.Time, limit int) {
	for k, d := range sh.m {
		if !now.Before(d.until) {
			delete(sh.m, k)
		}
	}
	for k := range sh.m {
		if len(sh.m) < limit {
			break
		}
		delete(sh.m, k)
	}
}

func (d *denial) matches(req *Request) bool {
	return d.limit == req.Bucket.Limit && d.globalKey == req.Global.Key &&
		d.globalLimit == req.Global.Limit && d.cost == req.cost()
}

// result is the cached denial as of now: the same usage, with the retry
// times shortened by the time that passed.
func (d *denial) result(now time.Time) Result {
	res := d.res
	res.Cached = true
	left := d.until.Sub(now)
	res.RetryAfter = left
	if res.Bucket.Denied {
		res.Bucket.RetryAfter = min(res.Bucket.RetryAfter, left)
	}
	if res.Global.Denied {
		res.Global.RetryAfter = min(res.Global.RetryAfter, left)
	}
	return res
}
