package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Mode is what a store does with an Op.
type Mode uint8

// The modes.
const (
	// ModeCheck checks the request and, when it fits, records it (and takes
	// its lease).
	ModeCheck Mode = iota
	// ModePeek reports what ModeCheck would decide and writes nothing.
	ModePeek
	// ModeCheckOnly checks the request and takes its lease, but records no
	// units: count_only records them after the response, with ModeRecord.
	ModeCheckOnly
	// ModeRecord records the units without checking anything.
	ModeRecord
	// ModeRelease releases the request's lease.
	ModeRelease
)

// Kind is how a part of a request counts: an algorithm, or calendar periods.
type Kind uint8

// The kinds; their values are the script's.
const (
	KindLog      Kind = 1 // sliding_log: a sorted set
	KindCounter  Kind = 2 // sliding_counter: a hash, ten buckets per window
	KindFixed    Kind = 3 // fixed_window: a hash, one counter per window
	KindToken    Kind = 4 // token_bucket: a hash, one arrival time per window
	KindCalendar Kind = 5 // calendar periods: a hash, one counter per period
	// KindShare is a data centre's share of a global ceiling kept in a
	// ledger (global_redis): a hash of grants; its windows are the
	// ceiling's, for the reply.
	KindShare Kind = 6
)

// kindNames are the kinds' segment in keys.
var kindNames = [...]string{KindLog: "log", KindCounter: "counter", KindFixed: "fixed", KindToken: "token", KindCalendar: "calendar", KindShare: "share"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// MaxWindows bounds the windows of one bucket (duration and calendar).
const MaxWindows = 8

// MaxValue bounds every limit, cost and burst: the scripts compute in
// doubles, exact to 2^53.
const MaxValue = 1 << 50

// Op is one request to a store: check, peek, record or release, over every
// part of the request at once. All keys of an Op share one hash tag.
type Op struct {
	Mode Mode
	// nowIsWall: Now is a reading of the wall clock (time.Now), which the
	// in-process store may take for its expiry instead of reading it
	// again; it does so once (a later call on the Op reads the clock).
	nowIsWall bool
	// static: the Op counts the global ceiling on the data centre's static
	// share (fail local, cut off from the ledger), not on its share.
	static bool
	// Now is the time of the request in µs since the Unix epoch; 0 asks the
	// store for its own clock (Redis TIME for the Redis store).
	Now int64
	// Deadline, when set, is when the caller gives up: a Redis check that
	// reaches Redis later (a stalled network) is not run, so it is never
	// charged after its caller applied the fail mode.
	Deadline time.Time
	// Cost is the units the request consumes (>= 1).
	Cost int64
	// Parts are the keys counted, each with its windows.
	Parts []Part
	// Ban, when set, is the key's penalty box.
	Ban *BanOp
	// Lease, when set, bounds the requests in flight.
	Lease *LeaseOp
	// Override, when set, is the identity's overrides hash: an active
	// override there changes the limits of the windows it names.
	Override *OverrideRef

	// usageBuf, when set, backs the decision's windows (see
	// Limiter.windows), so that a request's Op and its windows are one
	// allocation. It is used once.
	usageBuf []WindowUsage
	// replyBuf, when set, backs the Usage of a store's reply (see
	// usageFor). It is used once.
	replyBuf []Usage
}

// usageFor is an empty Usage slice of capacity n for a reply: the Op's own
// buffer the first time, a new slice after (a later call on the same Op,
// count_only's record, must not overwrite a reply that may still be held,
// by the deny cache for one).
func (op *Op) usageFor(n int) []Usage {
	if b := op.replyBuf; n <= cap(b) {
		op.replyBuf = nil
		return b[:0:n]
	}
	return make([]Usage, 0, n)
}

// OverrideRef points a request at its identity's overrides.
type OverrideRef struct {
	Key string
	// Scope is the request's region as it stands in keys ("" without
	// regions): an override of that region wins over the identity's.
	Scope string
}

// Part is one key of a request and the windows it counts.
type Part struct {
	Key  string
	Kind Kind
	// Global marks the identity's global ceiling.
	Global  bool
	Windows []Win
	// Lead and Claim are, for KindShare, how long ahead of need (µs) the
	// share is renewed, and how long a renewal's claim lasts; Sig, the
	// signature of the global limits (grants made under others are not
	// used).
	Lead, Claim int64
	Sig         string
}

// Win is one window of a part.
type Win struct {
	// Name names the window's state in its key: the length in µs as a
	// decimal string, or the calendar period's name.
	Name string
	// Len is the window's length in µs (duration kinds).
	Len int64
	// Limit is the units admitted per window (> 0).
	Limit int64
	// Burst is, for KindToken, the capacity; 0 means Limit.
	Burst int64
	// Bounds are, for KindCalendar, the starts of three periods in a row and
	// the end of the third, around the caller's clock.
	Bounds [4]int64
}

// BanOp is the penalty box of a request's key.
type BanOp struct {
	Key string
	// After denials weighted over a sliding span of Within µs ban the key
	// for For µs.
	After, Within, For int64
	// Wait is how long the caller would queue the request (µs): a refusal
	// whose every refusing window has room within Wait is not counted, as
	// the request waits and is checked again (only its last refusal
	// counts). A refusal by the concurrency bound alone never counts.
	Wait int64
}

// LeaseOp bounds the requests of a key in flight.
type LeaseOp struct {
	Key string
	// Max leases at once, each expiring Timeout µs after it was taken.
	Max, Timeout int64
	// ID names this request's lease (unique across processes).
	ID string
}

// Status is a store's verdict on an Op.
type Status uint8

// The statuses; their values are the script's.
const (
	StatusDenied  Status = 0
	StatusAllowed Status = 1
	StatusBanned  Status = 2
	// StatusLate: the check reached Redis after its deadline and was not run.
	StatusLate Status = 3
	// StatusTooLarge: an override lowered a window's capacity below the
	// cost, so the request can never fit (nothing was recorded).
	StatusTooLarge Status = 4
)

// Reply is a store's answer to an Op.
type Reply struct {
	Status Status
	// Now is the time the store decided at (µs).
	Now int64
	// BanLeft is how long the key stays banned (µs), when banned;
	// BanStarted is true when this request started the ban.
	BanLeft    int64
	BanStarted bool
	// InFlight is the leases held after the request; -1 without a lease.
	// LeaseDenied is true when the concurrency bound denied it.
	InFlight    int64
	LeaseDenied bool
	// Usage is one entry per window of the Op's parts, in order.
	Usage []Usage
	// Cached is true for a denial served by a DenyCache.
	Cached bool
	// Limits and Bursts are, when an override changed a limit, every
	// window's limit and burst as decided (burst 0: the limit), in order;
	// nil otherwise.
	Limits, Bursts []int64
	// Share is, for an Op with a KindShare part, what the store said of the
	// share (ShareRenew, ShareAsk, ShareShort).
	Share ShareFlags
}

// ShareFlags are what a check says of a data centre's share of a global
// ceiling.
type ShareFlags uint8

// The flags; their values are the script's (its reply's flags, less the
// concurrency bound's 1).
const (
	// ShareRenew: the caller holds the claim to renew the share, in the
	// background.
	ShareRenew ShareFlags = 2
	// ShareAsk: the share is short and the ledger never answered for it
	// under these limits (the identity's first request in the data
	// centre): the caller asks it now.
	ShareAsk ShareFlags = 4
	// ShareShort: the share did not hold the cost.
	ShareShort ShareFlags = 8
	// ShareOnly: the share alone refused the request (every other window
	// had room).
	ShareOnly ShareFlags = 16
	// ShareFull: the ledger said it has no room yet.
	ShareFull ShareFlags = 32
)

// Usage is one window after a decision, in µs and units.
type Usage struct {
	// Count is the units in the window (after the request when recorded).
	Count int64
	// Retry is, when the window has no room for the cost, the time until it
	// has; 0 when it has room.
	Retry int64
	// Reset is the time until more quota comes back (0 when empty).
	Reset int64
	// Unknown is true when the store cannot say (a cached denial does not
	// know the windows that did not deny).
	Unknown bool
}

// Store decides Ops. Implementations are safe for concurrent use.
//
// Error policy: a Store returns an error only when it could not decide
// (unreachable, timed out, a malformed reply). "Over the limit" is a Reply
// with StatusDenied, never an error.
type Store interface {
	Do(ctx context.Context, op *Op) (Reply, error)
	// Reset forgets the given keys.
	Reset(ctx context.Context, keys ...string) error
}

// ErrInvalidOp is wrapped by every error about a malformed Op.
var ErrInvalidOp = errors.New("invalid rate limit op")

// validate checks what every store relies on.
func (op *Op) validate() error {
	if op.Mode > ModeRelease {
		return fmt.Errorf("%w: mode %d", ErrInvalidOp, op.Mode)
	}
	if op.Mode == ModeRelease {
		if op.Lease == nil || op.Lease.Key == "" || op.Lease.ID == "" {
			return fmt.Errorf("%w: release needs a lease", ErrInvalidOp)
		}
		return nil
	}
	if op.Cost <= 0 || op.Cost > MaxValue {
		return fmt.Errorf("%w: cost %d out of range", ErrInvalidOp, op.Cost)
	}
	if len(op.Parts) == 0 {
		return fmt.Errorf("%w: no parts", ErrInvalidOp)
	}
	for i := range op.Parts {
		p := &op.Parts[i]
		if p.Key == "" || p.Kind < KindLog || p.Kind > KindShare || len(p.Windows) == 0 || len(p.Windows) > MaxWindows {
			return fmt.Errorf("%w: part %d (%q, %s, %d windows)", ErrInvalidOp, i, p.Key, p.Kind, len(p.Windows))
		}
		for j := range p.Windows {
			w := &p.Windows[j]
			if w.Limit <= 0 || w.Limit > MaxValue || w.Burst < 0 || w.Burst > MaxValue || !plainName(w.Name) {
				return fmt.Errorf("%w: window %q: limit %d, burst %d", ErrInvalidOp, w.Name, w.Limit, w.Burst)
			}
			if p.Kind == KindShare {
				continue
			}
			if p.Kind == KindCalendar {
				b := w.Bounds
				if !(b[0] < b[1] && b[1] < b[2] && b[2] < b[3]) {
					return fmt.Errorf("%w: calendar window %q bounds %v", ErrInvalidOp, w.Name, b)
				}
			} else if w.Len < 1000 || w.Len > maxWindowMicros {
				return fmt.Errorf("%w: window %q of %dµs", ErrInvalidOp, w.Name, w.Len)
			}
		}
		if p.Kind == KindShare && (p.Lead < 0 || p.Claim <= 0 || op.Mode == ModeRecord || op.Mode == ModeCheckOnly) {
			return fmt.Errorf("%w: share part (lead %d, claim %d, mode %d)", ErrInvalidOp, p.Lead, p.Claim, op.Mode)
		}
	}
	if b := op.Ban; b != nil && (b.Key == "" || b.After <= 0 || b.Within <= 0 || b.For <= 0 || b.Wait < 0) {
		return fmt.Errorf("%w: ban %+v", ErrInvalidOp, *b)
	}
	if l := op.Lease; l != nil && (l.Key == "" || l.Max <= 0 || l.Timeout <= 0 || l.ID == "") {
		return fmt.Errorf("%w: lease %+v", ErrInvalidOp, *l)
	}
	if o := op.Override; o != nil && o.Key == "" {
		return fmt.Errorf("%w: override with no key", ErrInvalidOp)
	}
	return nil
}

// windows is the number of windows of all parts.
func (op *Op) windows() int {
	n := 0
	for i := range op.Parts {
		n += len(op.Parts[i].Windows)
	}
	return n
}

// maxWindowMicros bounds a duration window: ten years, far below what
// doubles and durations hold.
const maxWindowMicros = 10 * 366 * 24 * 3600 * 1e6

// Scratch is room for one decision's Op: its parts, keys and windows, the
// decision's windows and the store's reply. A caller that
// allocates something per request anyway (Caddy's handler: the request's
// placeholder state) can hold one in it and give it in Input.Scratch, and
// Decide allocates none of its own for them. A Scratch serves one Decide
// (the first one given it; later ones allocate), and what it holds lives
// as long as the Decision does. The zero value is ready.
type Scratch struct {
	b    opBuf
	used bool
}

// opBuf is an Op with what it points to, in one allocation.
//
// Its arrays are sized for the common limiter (one key, one or two
// windows, a ban and a lease); a limiter with more gets slices of its own
// (see Limiter.op), so that a request zeroes, and the collector scans, no
// room it does not use.
type opBuf struct {
	op    Op
	parts [2]Part
	wins  [2]Win // the windows, when they are few (4 * MaxWindows is the most)
	keys  [3]string
	ban   BanOp
	lease LeaseOp
	ov    OverrideRef
	usage [2]WindowUsage // the decision's windows, when they are few
	reply [2]Usage       // the store's reply, when it has few windows
}

// take returns the scratch's buffer the first time, a new one after (or
// when s is nil).
func (s *Scratch) take() *opBuf {
	if s == nil || s.used {
		return new(opBuf)
	}
	s.used = true
	return &s.b
}

// plainName reports whether a window's name is 1 to 64 printable ASCII
// bytes without a quote or a backslash: it goes into the script's JSON shape as it is
// (lua/decide.lua) and names hash fields, so a name that escapes would
// shift the values the script reads. The engine's own names (a length's
// digits, hour, day, week, month, period(n)) all are.
func plainName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// Input is one request, resolved by the caller (placeholders, headers).
type Input struct {
	// Identity is whose budget the request spends (an API key, an IP).
	Identity string
	// Region is the request's region, with Policy.Regions.
	Region string
	// Limits are the limits of Policy.Windows, in order.
	Limits []int64
	// GlobalLimits are the limits of Policy.GlobalWindows, in order.
	GlobalLimits []int64
	// Cost is the units the request consumes; 0 means 1.
	Cost int64
	// MaxConcurrent bounds the requests in flight, with Policy.Concurrency.
	MaxConcurrent int64
	// Scratch, when set, is where Decide builds the request's Op (its keys
	// and windows, and the decision's windows), instead of an allocation
	// of its own. See Scratch.
	Scratch *Scratch
}
