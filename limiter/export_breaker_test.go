package limiter

// BreakerRefuses reports whether b's circuit refuses calls now (open, its
// cool-down not over, or half open with its probe out): a call through it
// is held or refused, never sent.
func BreakerRefuses(b *Breaker) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case Open:
		return b.cfg.Now().Before(b.openUntil)
	case HalfOpen:
		return b.probing
	}
	return false
}
