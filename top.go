package slidingratelimit

// Top offenders: the keys a limiter refused most on this node (and,
// counted apart, the keys that crossed warn_at most) over the last 5 to 10
// minutes, in fixed memory.

import (
	"encoding/binary"
	"encoding/hex"
	"hash/maphash"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

const (
	// topCounters is the counters of a sketch: per limiter, per kind
	// (denials, near-limit crossings) and per epoch.
	topCounters = 1024
	// topEpoch is how long an epoch counts; the top covers the current one
	// and the one before: the last 5 to 10 minutes.
	topEpoch = 5 * time.Minute
	// maxTopLabel bounds the bytes of a raw key or region kept per counter.
	maxTopLabel = 128
)

// The kinds of events counted.
const (
	kindDenied = iota // refusals: limited, cached denials, bans, concurrency, a cost too large; dry-run would-be denials
	kindNear          // near-limit crossings
	kinds
)

// offenders counts a limiter's denials and near-limit crossings by key and
// region in Space-Saving sketches, one pair of epochs per kind: events go
// to the current epoch; every topEpoch the current one becomes the previous
// one and the previous one is cleared. Its memory is allocated at a kind's
// first event and never grows: 4 sketches of topCounters counters. Every
// handler of one limiter name shares one, across reloads.
type offenders struct {
	mu     sync.Mutex
	seed   maphash.Seed
	start  int64                  // unix ns: the current epoch's start; 0 before any event
	epochs [kinds][2]*spaceSaving // [kind][current, previous]; nil until used
}

func newOffenders() *offenders { return &offenders{seed: maphash.MakeSeed()} }

// note counts one event of kind for identity and region: retry is the
// Retry-After of a denial, in seconds. It allocates only when the key takes
// a counter.
func (o *offenders) note(kind int, identity, region string, logKey bool, retry int64, now time.Time) {
	id := o.id(identity, region)
	ns := now.UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rotate(ns)
	e := &o.epochs[kind]
	if e[0] == nil {
		e[0] = newSpaceSaving(topCounters)
	}
	c, fresh := e[0].add(id)
	if fresh {
		c.hash = limiter.KeyDigest(identity)
		c.region = clip(region)
	}
	if logKey && c.key == "" {
		c.key = clip(identity)
	}
	c.retry = retry
	c.seen = ns
}

// id is the item of a key and region in the sketches: a 64-bit hash,
// seeded per limiter (its collisions are as unlikely as they are
// unpredictable).
func (o *offenders) id(identity, region string) uint64 {
	var mh maphash.Hash
	mh.SetSeed(o.seed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(identity)))
	mh.Write(n[:])
	mh.WriteString(identity)
	mh.WriteString(region)
	return mh.Sum64()
}

// rotate moves to the epoch of now.
func (o *offenders) rotate(now int64) {
	epoch := int64(topEpoch)
	switch {
	case o.start == 0 || now >= o.start+2*epoch:
		// Both epochs are over (or none began).
		for k := range o.epochs {
			for _, s := range o.epochs[k] {
				if s != nil {
					s.reset()
				}
			}
		}
		o.start = now
	case now >= o.start+epoch:
		for k := range o.epochs {
			e := &o.epochs[k]
			e[0], e[1] = e[1], e[0]
			if e[0] != nil {
				e[0].reset()
			}
		}
		o.start += epoch
	}
}

// offender is one key in the top offenders. Counts are Space-Saving
// estimates: the true count is within [count - error, count].
type offender struct {
	Key            string    `json:"key,omitempty"`
	KeyHash        string    `json:"key_hash"`
	Region         string    `json:"region,omitempty"`
	Denials        int64     `json:"denials"`
	DenialsError   int64     `json:"denials_error"`
	NearLimit      int64     `json:"near_limit"`
	NearLimitError int64     `json:"near_limit_error"`
	RetryAfter     int64     `json:"retry_after,omitempty"`
	LastSeen       time.Time `json:"last_seen"`
}

// topInfo is the answer of GET /sliding_ratelimit/<name>/top.
type topInfo struct {
	Limiter   string     `json:"limiter"`
	At        time.Time  `json:"at"`
	Since     time.Time  `json:"since"`
	Counters  int        `json:"counters"`
	KeysShown string     `json:"keys_shown"`
	Denied    []offender `json:"denied"`
	NearLimit []offender `json:"near_limit"`
}

// report lists the n keys with the most denials and the n with the most
// near-limit crossings since the previous epoch began. Raw keys are shown
// only when logKey is set (now).
func (o *offenders) report(name string, n int, logKey bool, now time.Time) topInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rotate(now.UnixNano())
	info := topInfo{Limiter: name, At: now.UTC(), Since: time.Unix(0, o.start).UTC(), Counters: topCounters,
		KeysShown: "hash", Denied: []offender{}, NearLimit: []offender{}}
	if logKey {
		info.KeysShown = "raw"
	}
	for k := range o.epochs {
		if prev := o.epochs[k][1]; prev != nil && len(prev.counters) > 0 {
			info.Since = time.Unix(0, o.start-int64(topEpoch)).UTC()
		}
	}
	info.Denied = o.top(kindDenied, n, logKey)
	info.NearLimit = o.top(kindNear, n, logKey)
	return info
}

// top is the n keys of kind with the highest counts.
func (o *offenders) top(kind, n int, logKey bool) []offender {
	type ranked struct {
		offender
		lo int64
	}
	var out []ranked
	done := map[uint64]bool{}
	for _, s := range o.epochs[kind] {
		if s == nil {
			continue
		}
		for i := range s.counters {
			id := s.counters[i].id
			if done[id] {
				continue
			}
			done[id] = true
			of := o.entry(id, logKey)
			lo := of.Denials - of.DenialsError
			if kind == kindNear {
				lo = of.NearLimit - of.NearLimitError
			}
			out = append(out, ranked{of, lo})
		}
	}
	count := func(r *ranked) int64 {
		if kind == kindNear {
			return r.NearLimit
		}
		return r.Denials
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := &out[i], &out[j]
		switch {
		case count(a) != count(b):
			return count(a) > count(b)
		case a.lo != b.lo:
			return a.lo > b.lo
		case !a.LastSeen.Equal(b.LastSeen):
			return a.LastSeen.After(b.LastSeen)
		}
		return a.KeyHash < b.KeyHash
	})
	res := make([]offender, 0, min(n, len(out)))
	for i := 0; i < len(out) && i < n; i++ {
		res = append(res, out[i].offender)
	}
	return res
}

// entry is what both kinds and both epochs know of id.
func (o *offenders) entry(id uint64, logKey bool) offender {
	var of offender
	var seen, retrySeen int64
	for k := range o.epochs {
		var hi, lo int64
		for _, s := range o.epochs[k] {
			if s == nil {
				continue
			}
			c := s.get(id)
			if c == nil {
				hi += s.floor() // it may have been counted and evicted
				continue
			}
			hi += c.count
			lo += c.count - c.err
			if c.seen >= seen {
				seen = c.seen
				of.KeyHash, of.Region = hex.EncodeToString(c.hash[:]), c.region
			}
			if logKey && c.key != "" {
				of.Key = c.key
			}
			if k == kindDenied && c.seen >= retrySeen {
				retrySeen, of.RetryAfter = c.seen, c.retry
			}
		}
		if k == kindDenied {
			of.Denials, of.DenialsError = hi, hi-lo
		} else {
			of.NearLimit, of.NearLimitError = hi, hi-lo
		}
	}
	of.LastSeen = time.Unix(0, seen).UTC()
	return of
}

// keyHash is the key as the top offenders and the overrides show it
// without log_key (limiter.KeyHash).
func keyHash(identity string) string { return limiter.KeyHash(identity) }

// clip is a copy of s, at most maxTopLabel bytes of it.
func clip(s string) string {
	if len(s) > maxTopLabel {
		s = s[:maxTopLabel]
	}
	return strings.Clone(s)
}

// sharedOffenders is the top offenders of the limiter name: those of its
// live handlers (a reload keeps them), or new ones.
func sharedOffenders(name string) *offenders {
	registry.Lock()
	defer registry.Unlock()
	if hs := registry.byName[name]; len(hs) > 0 && hs[len(hs)-1].rt.top != nil {
		return hs[len(hs)-1].rt.top
	}
	return newOffenders()
}
