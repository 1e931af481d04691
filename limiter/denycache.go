package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDenyCacheSize is the default bound on cached denials.
const DefaultDenyCacheSize = 65536

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
	store Store
	now   func() time.Time
	max   int64
	// m maps a bucket key to its denial. A sync.Map: the hot path is many
	// cores reading one hot key's entry, which takes no lock here.
	m     sync.Map
	size  atomic.Int64
	evict sync.Mutex // one evictor at a time
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
	return &DenyCache{store: store, now: now, max: int64(size)}
}

// Len returns the number of cached denials (expired ones included until
// they are pushed out).
func (c *DenyCache) Len() int { return int(c.size.Load()) }

// Allow implements Store. A denial served from the cache has Cached set.
func (c *DenyCache) Allow(ctx context.Context, req *Request) (Result, error) {
	start := req.Now
	if start.IsZero() {
		start = c.now()
	}
	key := req.Bucket.Key
	v, ok := c.m.Load(key)
	if ok {
		d := v.(*denial)
		if start.Before(d.until) && d.matches(req) {
			return d.result(start), nil
		}
		if !start.Before(d.until) {
			c.drop(key, d)
			ok = false
		}
	}

	res, err := c.store.Allow(ctx, req)
	if err != nil || (!ok && res.Allowed) || (!res.Allowed && res.RetryAfter <= 0) {
		return res, err
	}
	if res.Allowed {
		// A request of another cost (or without the global ceiling) got
		// in: a cached denial of this bucket would now under-state the wait.
		c.drop(key, nil)
		return res, nil
	}
	d := &denial{
		until:       start.Add(res.RetryAfter),
		limit:       req.Bucket.Limit,
		globalKey:   req.Global.Key,
		globalLimit: req.Global.Limit,
		cost:        req.cost(),
		res:         res,
	}
	if _, loaded := c.m.Swap(key, d); !loaded {
		if c.size.Add(1) > c.max {
			c.shrink(start)
		}
	}
	return res, nil
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
// then arbitrary ones.
func (c *DenyCache) shrink(now time.Time) {
	if !c.evict.TryLock() {
		return // another request is at it
	}
	defer c.evict.Unlock()
	c.m.Range(func(k, v any) bool {
		if d := v.(*denial); !now.Before(d.until) {
			c.drop(k.(string), d)
		}
		return true
	})
	c.m.Range(func(k, v any) bool {
		if c.size.Load() <= c.max*9/10 {
			return false
		}
		c.drop(k.(string), v.(*denial))
		return true
	})
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
		c.m.Range(func(k, v any) bool {
			c.drop(k.(string), v.(*denial))
			return true
		})
		return
	}
	for _, k := range keys {
		c.drop(k, nil)
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
