package limiter

import (
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter/internal/rediskit"
)

// clockOffset is Redis's clock's offset from this process's
// (rediskit.Offset: the ledger's client keeps one too).
type clockOffset = rediskit.Offset

// ErrBadReply is wrapped by errors about a script reply of the wrong shape.
var ErrBadReply = rediskit.ErrBadReply

// ErrLate is returned for a check that reached Redis after its deadline:
// Redis did not run it.
var ErrLate = rediskit.ErrLate

// sample takes one reading of Redis's clock (µs), by a call sent at sent.
func (o *offsetClock) sample(redisNow int64, sent time.Time) { o.Sample(redisNow, sent) }

// deadline is d on Redis's clock for the script: 0 without a deadline, -1
// while the offset is unknown (Do learns it first, see learnClock: a check
// is sent with -1, which the script runs however late, only where Redis
// refuses TIME to the caller).
func (o *offsetClock) deadline(d time.Time) int64 { return o.Deadline(d) }
