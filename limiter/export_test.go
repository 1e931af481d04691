package limiter

import "context"

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
