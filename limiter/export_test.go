package limiter

import (
	"context"
	"time"
)

// SetOverrideFields and DeleteOverrideScope reach a store's overrides
// directly, for the differential test.
func SetOverrideFields(ctx context.Context, s Store, key, scope string, now, ttl int64, fields []string) (int64, error) {
	return s.(overrider).overrideSet(ctx, key, scope, now, ttl, fields)
}

func DeleteOverrideScope(ctx context.Context, s Store, key, scope string, now int64) (bool, error) {
	return s.(overrider).overrideDel(ctx, key, scope, now)
}

// QueueWaiters is the number of queue places l holds (requests waiting for
// their turn), for the simulation's invariant that none is held without a
// waiter.
func QueueWaiters(l *Limiter) int64 { return l.waiters.Load() }

// DecidedStatic reports whether the store decided d on the data centre's
// static share (fail local) rather than on its share of the ceiling.
func DecidedStatic(d Decision) bool { return d.static }

// DenyCacheHolds reports whether c holds a live denial of an identity
// (its tag), for the simulation.
func DenyCacheHolds(c *DenyCache, tag string) bool {
	now := c.now().UnixNano()
	held := false
	c.m.Range(func(k, v any) bool {
		if HashTag(k.(string)) == tag && now < v.(*denial).until {
			held = true
		}
		return !held
	})
	return held
}

// SetSleep makes l's queue wait through f instead of a timer: a
// simulation moves its clock there (f reports false for a client that went
// away). Set it before l decides anything.
func SetSleep(l *Limiter, f func(ctx context.Context, d time.Duration) bool) { l.sleep = f }

// BreakerHeld is the number of releases and records b holds for its store,
// and whether it is sending them, for the simulation.
func BreakerHeld(b *Breaker) (n int, sending bool) {
	return int(b.held.n.Load()), b.held.sending.Load()
}

// ReadOverrideIndex makes l read its index of live overrides now, as its
// watcher does every OverrideRefresh.
func ReadOverrideIndex(l *Limiter) { l.readIndex() }

// WithCachedScript makes a store call lua.DecideCached by EVALSHA whatever
// its Redis, as ScriptsAuto does on Redis 5 and 6 (on Redis 7, whose _G a
// script cannot write, every call builds the body: the uncached case).
func WithCachedScript() RedisOption {
	return func(s *RedisStore) { s.scripts.path.Store(int32(pathCached)) }
}

// CachedScriptSHA is lua.DecideCached's SHA-1, as the store sends it.
var CachedScriptSHA = cachedArg.(string)

// RewriteTokenStates does to s what the previous release's script (and
// this one's until 2026-12-06) writes on a check of op that records
// nothing: each token bucket part whose state was written under another
// interval or burst is rewritten under op's, cost 0, at most a full
// bucket. This release rewrites such a state only when it records;
// TestMixedVersions models the previous release's denials with this. It
// reports whether it rewrote a state.
func RewriteTokenStates(s *MemoryStore, op *Op) bool {
	sh := s.shard(op.Parts[0].Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	m := memDo{s: s, sh: sh, op: op, now: op.Now, wall: s.wallNow()}
	evs := make([]winEval, 0, op.windows())
	keys := make([]*memKey, len(op.Parts))
	restate := make([]bool, len(op.Parts))
	evs, _, _, _ = m.checkParts(evs, keys, restate)
	off, rewrote := 0, false
	for i := range op.Parts {
		p := &op.Parts[i]
		if p.Kind == KindToken && restate[i] {
			m.recordHash(p, keys[i], evs[off:off+len(p.Windows)], true, false)
			rewrote = true
		}
		off += len(p.Windows)
	}
	return rewrote
}
