// Package rediskit is what the Redis store (package limiter) and the
// ledger's client (package limiter/dc) share, below both: the errors of a
// script's reply and the offset of a Redis server's clock. It imports
// neither.
package rediskit

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBadReply is wrapped by errors about a script reply of the wrong shape.
var ErrBadReply = errors.New("malformed reply from redis script")

// ErrLate is returned for a check that reached Redis after its deadline:
// Redis did not run it.
var ErrLate = errors.New("check reached redis after its deadline; not run")

// Offset learns how far Redis's clock is from this process's, so a
// check can carry its deadline on Redis's clock. Each reply that read TIME
// gives a sample: Redis's time minus the local time the call was sent, at
// least the true offset (the check ran after it was sent). The smallest
// sample of the last two 5-second epochs is used: it is within one round
// trip of the truth, and always on the lenient side, so a check is never
// refused for a deadline it met. The zero value knows nothing yet.
type Offset struct {
	mu     sync.Mutex
	epoch  int64
	cur    int64 // smallest sample of this epoch
	prev   int64 // of the previous one
	hasCur bool
	known  atomic.Bool
	offset atomic.Int64
}

// Sample takes one reading: redisNow (µs) read by a call sent at sent.
func (o *Offset) Sample(redisNow int64, sent time.Time) {
	v := redisNow - sent.UnixMicro()
	e := sent.Unix() / 5
	o.mu.Lock()
	defer o.mu.Unlock()
	if e != o.epoch {
		o.prev, o.cur, o.hasCur = o.cur, v, true
		if e != o.epoch+1 || !o.known.Load() {
			o.prev = v
		}
		o.epoch = e
	} else if !o.hasCur || v < o.cur {
		o.cur, o.hasCur = v, true
	}
	o.offset.Store(min(o.cur, o.prev))
	o.known.Store(true)
}

// Deadline is d on Redis's clock for the script: 0 without a deadline, -1
// while the offset is unknown (the Redis store learns it first: a check is
// sent with -1, which the script runs however late, only where Redis
// refuses TIME to the caller).
func (o *Offset) Deadline(d time.Time) int64 {
	if d.IsZero() {
		return 0
	}
	if !o.known.Load() {
		return -1
	}
	return d.UnixMicro() + o.offset.Load()
}

// Known reports whether a sample was taken (since Forget).
func (o *Offset) Known() bool { return o.known.Load() }

// Forget makes the offset unknown, so that the next call learns it again
// (the samples stay, for the next epoch's).
func (o *Offset) Forget() { o.known.Store(false) }
