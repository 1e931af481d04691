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

// ReadOverrideIndex makes l read its index of live overrides now, as its
// watcher does every OverrideRefresh.
func ReadOverrideIndex(l *Limiter) { l.readIndex() }
