package dc

import (
	"context"
	"errors"
)

// A data centre's share of an identity's global ceiling, when the ceiling
// lives in a ledger every data centre shares (global_redis): the grants the
// ledger gave this data centre, kept in its own store beside the region's
// windows and checked with them in one call (a part of KindShare).
// lua/share.lua and lua/dcshare.lua document the state; the in-process
// store (limiter.MemoryStore) keeps the same, for one process; both
// stores implement ShareStore (limiter/share.go).

// Slots is how many grants a share holds at once (lua/dcshare.lua's too).
const Slots = 4

// ShareGrant is one grant held in a share.
type ShareGrant struct {
	// Units granted and used; Deadline (µs, the store's clock) after which
	// none is used; Start, the time read before the ledger was asked; Last,
	// the last use (0: none); ID, the ledger's.
	Units, Used, Deadline, Start, Last int64
	ID                                 string
}

// Closed reports whether no unit of g will be used after now.
func (g *ShareGrant) Closed(now int64) bool { return g.Deadline <= now || g.Used >= g.Units }

// ShareView is a share as a renewal reads it before asking the ledger.
type ShareView struct {
	// Now is the store's clock when read (µs): a grant asked for after it
	// is usable until Now + its length, never later.
	Now int64
	// Rate is the demand, units per second.
	Rate   int64
	Grants []ShareGrant
	// Stale: a recall under other limits than the share's (nothing was
	// read or changed: its grants are in use under the others).
	Stale bool
	// Inc is the share's incarnation as read: a reset (which deletes the
	// share) starts a new one, and a deposit into another one than its
	// renewal read changes nothing (Deposit.Inc).
	Inc string
}

// Standing is a data centre's standing with the ledger, kept in its store.
type Standing struct {
	// Static is true in static mode (cut off from the ledger, fail local);
	// Since when; Sent, the last time a node asked the ledger; N, the data
	// centres the ledger knew; Now, the store's clock.
	Static          bool
	Since, Sent, N  int64
	Now             int64
	AllowedToStatic bool // filled by the caller
}

// ShareStore is a store that keeps shares of a global ceiling: the Redis
// store and the in-process store.
type ShareStore interface {
	// ShareBegin reads a share before its renewal.
	// Grants under limits of another signature than sig are not in it:
	// they stay usable under their own limits until a deposit under sig
	// drops them, so a renewal never gives them back (the ledger counts
	// them to their end). Recall (the ledger recalled the share's unspent
	// grants) ends every live grant first: none is used after; a recall
	// under other limits than the share's is stale (Stale, nothing ends).
	ShareBegin(ctx context.Context, key, sig string, recall bool) (ShareView, error)
	// ShareDeposit, when the share is still the incarnation its renewal
	// read (d.Inc: not reset since; else it changes nothing and returns
	// -1), empties the slots of the grants returned, releases the claim,
	// keeps a grant of units (when > 0) usable until t0 + length, and
	// records until when the ledger has no room (now + retry; retry 0:
	// none) and when to ask it again anyway (now + the least of retry and
	// recheck). It returns the grant's slot, 0 when none was free.
	ShareDeposit(ctx context.Context, key string, d Deposit) (int, error)
	// StandingDo runs an operation on the data centre's standing: "send"
	// (before asking the ledger: false when in static mode), "static"
	// (arg: µs without an ask after which static mode starts), "normal"
	// (arg: the data centres the ledger knows), "poll" (arg: the same, 0 to
	// keep it).
	StandingDo(ctx context.Context, key, op string, arg int64) (Standing, bool, error)
}

// Deposit is what a renewal writes into a share.
type Deposit struct {
	T0, Units, Length, Retry, Recheck int64
	ID                                string
	Returned                          []string
	// Sig is the limits' signature: a share of another one drops its
	// grants first, unless Only: then nothing changes (the deposit of a
	// renewal whose limiter was closed since: a reload's new limits may be
	// the share's, and their grants must stay).
	Sig  string
	Only bool
	// Inc is the share's incarnation its renewal read (ShareView.Inc): a
	// share reset since is another, and the deposit changes nothing in it
	// (what the renewal learnt of the ledger, its grant and whether the
	// ledger is full, is of the state the reset forgot).
	Inc string
	// Counts are the ledger's counts of the share part's windows, in its
	// order, after the grant (nil: the ledger did not answer; the share
	// keeps the last ones): a window's count is them less what the share
	// holds unspent.
	Counts []int64
}

// ErrNoShareStore: the backend's store cannot keep shares of a global
// ceiling.
var ErrNoShareStore = errors.New("limiter: the store cannot keep shares of a global ceiling")
