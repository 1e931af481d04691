package limiter

import "sync/atomic"

// flight counts a limiter's requests between Decide and their Done (the
// lease to release, the count_only units to record), so that whoever owns
// the store gives it back only after the last of them reached it: a reload
// that replaces the Redis client must not close it under a request in
// flight.
type flight struct {
	n     atomic.Int64
	after atomic.Pointer[func(deferred bool)]
}

func (f *flight) enter() { f.n.Add(1) }

func (f *flight) leave() {
	if f.n.Add(-1) == 0 {
		if fn := f.after.Swap(nil); fn != nil {
			go (*fn)(true)
		}
	}
}

// AfterDone runs fn once every request this limiter has decided so far is
// done: at once (deferred false) when none is in flight, otherwise in the
// background after the last one's Done (deferred true). Call it after
// Close, when no new request comes; a later call replaces an fn not yet
// run.
func (l *Limiter) AfterDone(fn func(deferred bool)) {
	l.flight.after.Store(&fn)
	if l.flight.n.Load() == 0 {
		if fn := l.flight.after.Swap(nil); fn != nil {
			(*fn)(false)
		}
	}
}
