package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Source says who decided a request.
type Source string

// The sources.
const (
	SourceRedis      Source = "redis"       // the Redis store
	SourceMemory     Source = "memory"      // the in-process store (no Redis configured)
	SourceDenyCache  Source = "deny_cache"  // a denial cached from an earlier store answer
	SourceFailOpen   Source = "fail_open"   // the store failed; fail open passed the request
	SourceFailClosed Source = "fail_closed" // the store failed; fail closed refused it
	SourceLocal      Source = "local"       // the store failed; fail local decided in-process
)

// Outcome is what the limiter decided.
type Outcome uint8

// The outcomes.
const (
	// OutcomeAllowed: the request fits; it was recorded.
	OutcomeAllowed Outcome = iota
	// OutcomeLimited: a window has no room for it (429).
	OutcomeLimited
	// OutcomeBanned: its key is in the penalty box (429).
	OutcomeBanned
	// OutcomeConcurrency: its key has too many requests in flight (429).
	OutcomeConcurrency
	// OutcomeTooLarge: its cost is above a window's capacity, so it can
	// never fit, and retrying cannot help (413).
	OutcomeTooLarge
	// OutcomeUnavailable: the store could not decide and the fail mode is
	// open (the request passes) or closed (503).
	OutcomeUnavailable
)

var outcomeNames = [...]string{"allowed", "limited", "banned", "concurrency", "too_large", "unavailable"}

func (o Outcome) String() string { return outcomeNames[o] }

// WindowUsage is one window of a decision, ready to render.
type WindowUsage struct {
	// Policy names the window in RateLimit headers: the limiter's name,
	// with the window ("api-1h") when the limiter has several, and
	// "-global" for the global ceiling.
	Policy string
	// Window is the window; Global marks the global ceiling's.
	Window Window
	Global bool
	// Seconds is the window's length in whole seconds (rounded up): the
	// duration, the current calendar period, or, for a token bucket, the
	// time it takes to fill from empty.
	Seconds int64
	// Limit is the window's capacity: its limit, or a token bucket's burst.
	Limit int64
	// Known is false when the store's answer does not cover this window
	// (the store failed, a cached denial of another window, a cost that
	// never fits): only Limit and Seconds are set, and Retry when Denied.
	Known bool
	// Count is the units in the window, after the request when recorded.
	Count int64
	// Remaining is what is left of Limit: 0 when this window denied the
	// request, even when a few units are left (they are fewer than the
	// cost).
	Remaining int64
	// Denied is true when this window had no room for the request; Retry
	// is then the time until it has.
	Denied bool
	Retry  time.Duration
	// Reset is the time until more quota comes back (0 when empty): the
	// oldest unit leaves (sliding_log), the estimate drops by one
	// (sliding_counter), the window ends (fixed_window, calendar), the
	// bucket is full (token_bucket). On a denial it is Retry.
	Reset time.Duration
}

// Decision is the answer to one request: everything the caller renders
// (status, headers, body, placeholders, metrics) comes from it.
type Decision struct {
	// Outcome is what the limiter decided (in a dry run, what it would
	// have decided).
	Outcome Outcome
	// Pass is true when the request goes on to the next handler: allowed,
	// fail open, or a dry run.
	Pass bool
	// DryRun is true when the request passes only because of the dry run.
	DryRun bool
	// Source is who decided.
	Source Source
	// Err is the store's error, when it could not decide (then ErrKind
	// sorts it); with fail local, Source is SourceLocal and Err is the
	// error that sent the request there.
	Err     error
	ErrKind ErrKind
	// RetryAfter is, when the outcome is not allowed, the time until the
	// request would be admitted: the latest retry time of the windows that
	// denied it (every one of them has room then), the ban's end, or a
	// second for the concurrency bound; jitter included.
	RetryAfter time.Duration
	// Windows are the bucket's windows, then the global ceiling's.
	Windows []WindowUsage
	// Banned is true while the key is in the penalty box, BanLeft how long
	// it stays; BanStarted is true for the request that put it there.
	Banned     bool
	BanLeft    time.Duration
	BanStarted bool
	// InFlight is the key's requests in flight after this one took its
	// lease; -1 without a concurrency bound or when unknown.
	InFlight int64
	// Queued is true when the request waited for its turn; Waited is how
	// long.
	Queued bool
	Waited time.Duration
	// Took is the time spent in the store stack (without queueing).
	Took time.Duration
	// Identity, Region and Cost are the request's.
	Identity, Region string
	Cost             int64
	// Overridden is true when an operator's override changed a limit of
	// this request's windows (their Limit is the override's).
	Overridden bool
	// At is the store's time of the decision (zero when no store decided).
	At time.Time

	// static: the global ceiling was counted on the data centre's static
	// share (fail local, the data centre cut off from the ledger).
	static bool
	done   *pending
}

// pending is what Done has to do after the response.
type pending struct {
	op     *Op
	store  Store // the store that decided (a lease is released there)
	lease  bool  // a lease was taken
	record bool  // count_only: units to record when the status matches
	// id and region are the request's identity and region: the record
	// reads the identity's override as it is at the response (see Done).
	id, region string
	ended      atomic.Bool
}

// Tightest is the window with the least left (the one X-RateLimit headers
// describe): of the windows that denied, the one with the latest retry;
// otherwise the known window with the smallest remaining, then the one
// whose quota comes back last. Nil when no window is known.
func (d *Decision) Tightest() *WindowUsage {
	var t *WindowUsage
	for i := range d.Windows {
		w := &d.Windows[i]
		switch {
		case !w.Known && !w.Denied:
			continue
		case t == nil:
			t = w
		case w.Denied != t.Denied:
			if w.Denied {
				t = w
			}
		case w.Denied:
			if w.Retry > t.Retry {
				t = w
			}
		case w.Remaining < t.Remaining || w.Remaining == t.Remaining && w.Reset > t.Reset:
			t = w
		}
	}
	return t
}

// Limiter decides requests for one Policy over one Backend. Safe for
// concurrent use.
type Limiter struct {
	p Policy
	// wallClock: the policy's clock is time.Now, so a reading of it is
	// also the wall clock's (an Op's deadline, the in-process store's
	// expiry): one reading serves a request.
	wallClock bool
	b         Backend
	keys      KeyBuilder
	specs     []KeySpec // the request's keys: parts, then ban, then lease
	layout    []int     // Decision.Windows[i] is Op window layout[i]
	parts     []partSpec
	names     []string // RateLimit policy names of Decision.Windows
	wnames    []string // the windows' names in Ops (WindowName), worked out once
	stack     Store    // deny cache → breaker → store
	cache     *DenyCache
	channel   string
	unsub     func()
	waiters   atomic.Int64
	leaseNS   string
	leaseN    atomic.Uint64
	ov        overrideTags
	ovKick    chan struct{}
	ovStop    chan struct{}
	ovDone    chan struct{}
	ovView    atomic.Pointer[indexView]
	flight    flight                                          // requests between Decide and Done
	sleep     func(ctx context.Context, d time.Duration) bool // the queue's wait in a simulation (export_test.go); nil: a timer
	// g is the global ceiling kept in a ledger (Backend.Global); then
	// parts and specs hold the ceiling as one share part, and sparts and
	// sspecs as the static share's parts (fail local, cut off).
	g      ceiling
	sparts []partSpec
	sspecs []KeySpec

	closeOnce sync.Once
}

// partSpec is one part of every request's Op.
type partSpec struct {
	kind    Kind
	global  bool
	windows []int // indexes into the policy's windows (global ones after the bucket's)
}

// Backend is the store stack a Limiter asks.
type Backend struct {
	// Store decides: the Redis store behind its Breaker, or the in-process
	// store.
	Store Store
	// Base is the store behind any breaker: an operator's peek and reset
	// go straight to it. Default: Store.
	Base Store
	// Source is SourceRedis or SourceMemory.
	Source Source
	// Remote marks a store across a network: requests carry a deadline
	// (Op.Deadline, after Policy.Timeout), at which the store must give up
	// (the Limiter does not also put it on the context), and a DenyCache of
	// DenyCacheSize entries (0: the default; -1: none) goes in front of it.
	Remote        bool
	DenyCacheSize int
	// Local is the in-process store of fail local.
	Local Store
	// Notifier carries resets and lifted bans to every process sharing
	// Store (nil: this process only).
	Notifier Notifier
	// Global, when set, keeps the global ceiling in a ledger every data
	// centre shares (global_redis), and Store keeps this data centre's
	// share of it (Base must be a ShareStore).
	Global *Global
}

// New builds a Limiter. Close it when done.
func New(p Policy, b Backend) (*Limiter, error) {
	if p.KeyPrefix == "" {
		p.KeyPrefix = DefaultKeyPrefix
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	wallClock := reflect.ValueOf(p.Now).Pointer() == reflect.ValueOf(time.Now).Pointer()
	if p.Location == nil {
		p.Location = time.UTC
	}
	if p.Concurrency && p.LeaseTimeout == 0 {
		p.LeaseTimeout = DefaultLeaseTimeout
	}
	if p.Queue.MaxWait > 0 && p.Queue.MaxWaiters == 0 {
		p.Queue.MaxWaiters = DefaultMaxWaiters
	}
	if err := p.Check(); err != nil {
		return nil, err
	}
	if b.Store == nil {
		return nil, errors.New("limiter: backend has no store")
	}
	if b.Base == nil {
		b.Base = b.Store
	}
	kb, err := NewKeyBuilder(p.KeyPrefix, p.Name)
	if err != nil {
		return nil, &PolicyError{Field: "key_prefix", Err: err}
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	l := &Limiter{p: p, wallClock: wallClock, b: b, keys: kb, stack: b.Store, leaseNS: hex.EncodeToString(id[:]) + "-"}
	l.plan()
	if b.Global != nil {
		g, err := newGlobal(l.host(), *b.Global)
		if err != nil {
			return nil, err
		}
		l.g = g
	}
	if b.Remote && b.DenyCacheSize >= 0 {
		l.cache = NewDenyCache(b.Store, b.DenyCacheSize, p.Now)
		l.stack = l.cache
	}
	if b.Remote {
		// Set before the subscription: a notice may kick the watcher.
		l.ovKick, l.ovStop, l.ovDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	}
	if b.Notifier != nil {
		l.channel = p.KeyPrefix + "reset"
		l.unsub = b.Notifier.Subscribe(l.channel, l.notice)
	}
	if b.Remote {
		go l.watchOverrides()
	} else if list, err := l.ActiveOverrides(context.Background()); err == nil {
		// An in-process store outlives a config reload, and so do the
		// overrides set in it: the new limiter's requests read them.
		for _, e := range list {
			l.ov.add(e.Identity)
		}
	}
	return l, nil
}

// plan lays out every request's Op: the bucket's duration windows (one key
// of the algorithm's kind), its calendar periods (one calendar key), then
// the same for the global ceiling; then the ban and lease keys.
func (l *Limiter) plan() {
	all := append(append([]Window(nil), l.p.Windows...), l.p.GlobalWindows...)
	nb := len(l.p.Windows)
	pos := 0
	l.layout = make([]int, len(all))
	for _, global := range []bool{false, true} {
		for _, cal := range []bool{false, true} {
			ps := partSpec{kind: l.p.Algorithm.kind(), global: global}
			if cal {
				ps.kind = KindCalendar
			}
			for i, w := range all {
				if (i >= nb) == global && (w.Period != PeriodNone) == cal {
					ps.windows = append(ps.windows, i)
					l.layout[i] = pos
					pos++
				}
			}
			if len(ps.windows) > 0 {
				l.parts = append(l.parts, ps)
				l.specs = append(l.specs, KeySpec{Segment: ps.kind.String(), Global: global})
			}
		}
	}
	if l.b.Global != nil {
		l.shareParts()
	}
	if l.p.Ban != nil {
		// A dry run's would-be refusals ban no one: they count in a ban key
		// of their own, which only dry runs read.
		seg := "ban"
		if l.p.DryRun {
			seg = "dryban"
		}
		l.specs = append(l.specs, KeySpec{Segment: seg})
		l.sspecs = append(l.sspecs, KeySpec{Segment: seg})
	}
	if l.p.Concurrency {
		l.specs = append(l.specs, KeySpec{Segment: "lease"})
		l.sspecs = append(l.sspecs, KeySpec{Segment: "lease"})
	}
	l.names = make([]string, len(all))
	l.wnames = make([]string, len(all))
	for i, w := range all {
		l.wnames[i] = WindowName(w.Duration)
		name := l.p.Name
		global := i >= nb
		if global {
			name += "-global"
		}
		if global && len(l.p.GlobalWindows) > 1 || !global && len(l.p.Windows) > 1 {
			name += "-" + w.Label()
		}
		l.names[i] = name
	}
}

// shareParts puts the global ceiling in one share part (its windows in the
// order the layout gives them), and keeps its usual parts, under keys of
// their own, for the static share.
func (l *Limiter) shareParts() {
	l.sparts = append([]partSpec(nil), l.parts...)
	l.sspecs = append([]KeySpec(nil), l.specs...)
	share := partSpec{kind: KindShare, global: true}
	parts, specs := l.parts[:0:0], l.specs[:0:0]
	for i, ps := range l.parts {
		if ps.global {
			share.windows = append(share.windows, ps.windows...)
			l.sspecs[i].Segment = "static" + ps.kind.String()
			continue
		}
		parts, specs = append(parts, ps), append(specs, l.specs[i])
	}
	l.parts = append(parts, share)
	l.specs = append(specs, KeySpec{Segment: "share", Global: true})
}

// shareKey is the key of the share of in's identity.
func (l *Limiter) shareKey(in *Input) string { return l.keys.Global("share", in.Identity) }

// Close stops listening for notices and reading the overrides' index. It
// may be called more than once.
func (l *Limiter) Close() {
	l.closeOnce.Do(func() {
		if l.unsub != nil {
			l.unsub()
		}
		if l.ovStop != nil {
			close(l.ovStop)
			<-l.ovDone
		}
		if l.g != nil {
			l.g.Close()
		}
	})
}

// Policy returns the limiter's policy (with its defaults filled in).
func (l *Limiter) Policy() Policy { return l.p }

// Keys returns the limiter's key builder.
func (l *Limiter) Keys() KeyBuilder { return l.keys }

// DenyCache returns the limiter's deny cache, or nil.
func (l *Limiter) DenyCache() *DenyCache { return l.cache }

// notice handles a notice: "<namespace>\n<tag>" drops the cached denials
// of one identity of this limiter (a reset, a lifted ban), and with
// "\noverride" after it also marks the identity as having an override; ""
// (a subscription that started again, notices may have been missed) drops
// every cached denial and reads the overrides' index again.
func (l *Limiter) notice(msg string) {
	if msg == "" {
		if l.cache != nil {
			l.cache.Forget("")
		}
		l.kickOverrides()
		return
	}
	rest, ok := strings.CutPrefix(msg, l.keys.Namespace()+"\n")
	if !ok {
		return
	}
	tag, ov := strings.CutSuffix(rest, "\n"+overrideNotice)
	// The cached denials go before the override is marked, so that whoever
	// sees the identity as having an override (KnowsOverride) also sees
	// its denials of before the notice gone. Either order answers alike: a
	// request that knows of the override has another shape than the
	// denials cached without it, and one that does not yet know is decided
	// as before the notice.
	if l.cache != nil {
		l.cache.Forget(tag)
	}
	if ov {
		l.ov.add(tag)
	}
}

// ErrInput is wrapped by errors about an Input the policy cannot take (a
// limit out of range): the caller's configuration, not the store, is at
// fault.
var ErrInput = errors.New("invalid rate limit input")

func (l *Limiter) checkInput(in *Input) error {
	if len(in.Limits) != len(l.p.Windows) || len(in.GlobalLimits) != len(l.p.GlobalWindows) {
		return fmt.Errorf("%w: %d limits and %d global limits for %d and %d windows", ErrInput,
			len(in.Limits), len(in.GlobalLimits), len(l.p.Windows), len(l.p.GlobalWindows))
	}
	for _, ls := range [][]int64{in.Limits, in.GlobalLimits} {
		for _, v := range ls {
			if v <= 0 || v > MaxValue {
				return fmt.Errorf("%w: limit %d is not in 1..2^50", ErrInput, v)
			}
		}
	}
	if in.Cost < 0 || in.Cost > MaxValue {
		return fmt.Errorf("%w: cost %d is not in 1..2^50", ErrInput, in.Cost)
	}
	if l.p.Concurrency && (in.MaxConcurrent <= 0 || in.MaxConcurrent > MaxValue) {
		return fmt.Errorf("%w: max_concurrent %d is not in 1..2^50", ErrInput, in.MaxConcurrent)
	}
	return nil
}

// limitOf is the limit of window i (bucket windows first).
func limitOf(in *Input, nb, i int) int64 {
	if i < nb {
		return in.Limits[i]
	}
	return in.GlobalLimits[i-nb]
}

// op builds the request's Op (one allocation for its parts, windows and
// keys).
func (l *Limiter) op(in *Input, mode Mode, now time.Time) *Op {
	b := in.Scratch.take()
	parts, specs, static := l.parts, l.specs, l.g != nil && l.g.UsesStatic()
	if static {
		parts, specs = l.sparts, l.sspecs
	}
	keys := b.keys[:]
	if len(specs) > len(keys) {
		keys = make([]string, len(specs))
	}
	keys = keys[:len(specs)]
	l.keys.Keys(keys, specs, in.Identity, l.p.Regions, in.Region)
	op := &b.op
	op.Mode, op.Cost, op.static = mode, max(in.Cost, 1), static
	if l.p.AppClock || !l.b.Remote {
		op.Now = now.UnixMicro()
	}
	// On the wall clock, the in-process store takes op.Now for its expiry
	// (a reading an Op redone after a ledger's answer keeps is older: a key
	// then expires a moment later, never earlier).
	op.nowIsWall = l.wallClock && op.Now != 0
	if len(parts) <= len(b.parts) {
		op.Parts = b.parts[:len(parts)]
	} else {
		op.Parts = make([]Part, len(parts))
	}
	op.usageBuf, op.replyBuf = b.usage[:], b.reply[:]
	wins, nw := b.wins[:], 0
	for _, ps := range parts {
		nw += len(ps.windows)
	}
	if nw > len(wins) {
		wins = make([]Win, nw)
	}
	nb, k, wi := len(l.p.Windows), 0, 0
	for pi, ps := range parts {
		p := &op.Parts[pi]
		p.Key, p.Kind, p.Global = keys[k], ps.kind, ps.global
		p.Lead, p.Claim = 0, 0
		if ps.kind == KindShare {
			p.Lead, p.Claim, p.Sig = l.g.Lead(), l.g.Claim(), shareSig(in)
		}
		k++
		p.Windows = wins[wi : wi+len(ps.windows) : wi+len(ps.windows)]
		wi += len(ps.windows)
		for j, i := range ps.windows {
			w := &p.Windows[j]
			win := l.window(i)
			w.Limit = limitOf(in, nb, i)
			if static && i >= nb {
				w.Limit = max(l.g.StaticLimit(w.Limit), 1)
			}
			if win.Period != PeriodNone {
				w.Name = win.Period.String()
				w.Bounds = win.Period.Bounds(now, l.p.Location)
			} else {
				w.Name, w.Len = l.wnames[i], win.Duration.Microseconds()
				if i < nb {
					w.Burst = l.p.Burst
				}
			}
		}
	}
	if bn := l.p.Ban; bn != nil {
		b.ban = BanOp{Key: keys[k], After: bn.After, Within: bn.Within.Microseconds(), For: bn.For.Microseconds()}
		op.Ban = &b.ban
		k++
	}
	if l.p.Concurrency {
		b.lease = LeaseOp{Key: keys[k], Max: in.MaxConcurrent, Timeout: l.p.LeaseTimeout.Microseconds(),
			ID: l.leaseNS + strconv.FormatUint(l.leaseN.Add(1), 36)}
		op.Lease = &b.lease
	}
	if l.ov.n.Load() > 0 && l.ov.has(HashTag(keys[0])) {
		b.ov = OverrideRef{Key: l.overrideKey(in.Identity), Scope: l.scopeOf(in.Region)}
		op.Override = &b.ov
	}
	return op
}

func (l *Limiter) window(i int) Window {
	if i < len(l.p.Windows) {
		return l.p.Windows[i]
	}
	return l.p.GlobalWindows[i-len(l.p.Windows)]
}

// Decide decides one request. The error is for an Input the policy cannot
// take (ErrInput); a store that cannot decide is a Decision, by the fail
// mode. With a concurrency bound or count_only, call Done after the
// response.
func (l *Limiter) Decide(ctx context.Context, in *Input) (d Decision, err error) {
	l.flight.enter()
	err = l.decide(ctx, in, &d)
	if d.done == nil {
		l.flight.leave()
	}
	return d, err
}

// decide decides into d (zero; left so on an error). Decisions go by
// pointer here (and to finish, ledgerFailed), not by value: each copy took
// room for an argument and a result in the frames of every request's path
// (Decide and decide took 2.5 KB of stack, now 0.9 KB).
func (l *Limiter) decide(ctx context.Context, in *Input, d *Decision) error {
	if err := l.checkInput(in); err != nil {
		return err
	}
	now := l.p.Now()
	mode := ModeCheck
	if l.p.CountOnly != nil {
		mode = ModeCheckOnly
	}
	op := l.op(in, mode, now)
	*d = Decision{Identity: in.Identity, Cost: op.Cost, InFlight: -1}
	l.queueBudget(op, d)
	if l.p.Regions {
		d.Region = in.Region
	}

	if l.neverFits(in, op.Cost) {
		d.Outcome = OutcomeTooLarge
		d.Windows = l.windows(in, op, nil)
		l.finish(d)
		return nil
	}

	if l.g != nil && l.g.UsesStatic() && l.g.StaticNone(in.GlobalLimits) {
		l.ledgerFailed(in, op, d, errStatic)
		return nil
	}

	// A waiter's place, once taken, is given back on every way out.
	defer func() {
		if d.Queued {
			l.waiters.Add(-1)
		}
	}()
	asked := false // the ledger was asked for this request
	fresh := now   // now, while no ledger was waited for since
	for {
		reply, store, err := l.ask(ctx, op, fresh)
		if err == nil && reply.Share != 0 {
			var gerr error
			if op, asked, gerr = l.shared(ctx, in, op, &reply, mode, now, asked); gerr != nil {
				l.ledgerFailed(in, op, d, gerr)
				return nil
			} else if asked && reply.Share&ShareAsk != 0 {
				fresh = time.Time{}
				continue // ask the store again with the grant
			}
		}
		d.Took += l.p.Now().Sub(now)
		d.Err, d.ErrKind = err, KindOf(err)
		if store == nil {
			d.Outcome = OutcomeUnavailable
			d.Source = SourceFailOpen
			if l.p.Fail == FailClosed || l.p.Fail == FailLocal {
				d.Source = SourceFailClosed
			}
			d.Pass = l.p.Fail == FailOpen
			d.Windows = l.windows(in, op, nil)
			l.finish(d)
			return nil
		}
		l.decided(in, op, d, &reply, store)
		if d.Pass && (op.Lease != nil || mode == ModeCheckOnly) {
			d.done = &pending{op: op, store: store, lease: op.Lease != nil, record: mode == ModeCheckOnly,
				id: in.Identity, region: in.Region}
		}
		if d.Outcome == OutcomeLimited && l.wait(ctx, d) {
			now = l.p.Now()
			op = l.op(in, mode, now)
			fresh = now
			l.queueBudget(op, d)
			continue
		}
		l.finish(d)
		return nil
	}
}

// decided fills d from the reply of the store that decided op.
func (l *Limiter) decided(in *Input, op *Op, d *Decision, reply *Reply, store Store) {
	d.Source = l.b.Source
	if store == l.b.Local {
		d.Source = SourceLocal
	} else if reply.Cached {
		d.Source = SourceDenyCache
	}
	d.Windows = l.windows(in, op, reply)
	d.Overridden = reply.Limits != nil
	d.static = op.static
	if reply.Now > 0 {
		d.At = time.UnixMicro(reply.Now)
	}
	d.InFlight = reply.InFlight
	d.BanLeft = time.Duration(reply.BanLeft) * time.Microsecond
	d.Banned, d.BanStarted = reply.Status == StatusBanned, reply.BanStarted
	d.setOutcome(reply)
}

// shared acts on what the store said of the request's share of the global
// ceiling: the first request of the identity here (the ledger never
// answered for it) asks the ledger now, once (the caller asks the store
// again); a claim to renew is renewed in the background; a share that ran
// out while the ledger does not answer follows the fail mode. A request the
// share alone refused while the ledger had not said it was full (its renewal,
// asked ahead of need, is late) waits for that renewal until it is due;
// past that it is refused while the renewal is within the ledger's timeout
// (a slow ledger), and follows the fail mode after (it does not answer).
// It returns the Op to ask next.
func (l *Limiter) shared(ctx context.Context, in *Input, op *Op, r *Reply, mode Mode, now time.Time, asked bool) (*Op, bool, error) {
	if r.Share&ShareAsk != 0 && !asked {
		if err := l.g.Fetch(ctx, dcRequest(in, r), l.shareKey(in), op.Cost); err != nil {
			return op, true, err
		}
		return l.op(in, mode, now), true, nil
	}
	short := r.Status == StatusDenied && r.Share&ShareOnly != 0 && !asked
	if short && l.g.Failing() {
		// The share ran out and the ledger does not answer: the fail
		// mode, as for the identity's first request.
		if r.Share&ShareRenew != 0 {
			l.g.Later(dcRequest(in, r))
		}
		return op, asked, ErrLedgerUnreachable
	}
	if short && r.Share&ShareFull == 0 {
		// The share ran out while the ledger had not said it was full (nor
		// capped it at its fair rate: that says so): a renewal asked ahead
		// of need has not landed (demand outran its lead), or the ledger
		// stalls. The request waits for that renewal (the one in flight
		// here, or its own) until it is due, a lead after it began: back
		// in time, the store is asked again. Late while the ledger's last
		// call answered and the renewal has been out less than the
		// ledger's timeout, the ledger is slow, not down: the share's
		// refusal stands (a 429, Retry-After the lead). Once the renewal
		// has been out the timeout (a stalled ledger), or a call failed,
		// the fail mode applies, at once for the next requests.
		err := l.g.Await(ctx, dcRequest(in, r), l.shareKey(in), op.Cost)
		if errors.Is(err, errLedgerSlow) {
			l.g.Event(GlobalEvent{Kind: EventStarved})
			r.Share &^= ShareAsk
			return op, true, nil
		}
		if err != nil {
			return op, true, err
		}
		r.Share |= ShareAsk // the caller asks the store again
		return l.op(in, mode, now), true, nil
	}
	if r.Share&ShareRenew != 0 {
		l.g.Later(dcRequest(in, r))
	}
	if r.Status == StatusDenied && r.Share&ShareOnly != 0 && r.Share&ShareFull == 0 {
		// Refused here while the ledger had not said it was full.
		l.g.Event(GlobalEvent{Kind: EventStarved})
	}
	r.Share &^= ShareAsk
	return op, asked, nil
}

// ledgerFailed is the decision when the ledger could not renew a share
// the request needs: the fail mode, as for the store (fail local: the
// static share once the data centre is found cut off, and until then a
// 503).
func (l *Limiter) ledgerFailed(in *Input, op *Op, d *Decision, err error) {
	d.Err, d.ErrKind = err, KindOf(err)
	d.Outcome = OutcomeUnavailable
	d.Source = SourceFailClosed
	d.Pass = l.p.Fail == FailOpen
	if d.Pass {
		d.Source = SourceFailOpen
		l.g.Event(GlobalEvent{Kind: EventFailOpen})
	}
	d.Windows = l.windows(in, op, nil)
	l.finish(d)
}

// neverFits reports whether cost is above a window's capacity.
func (l *Limiter) neverFits(in *Input, cost int64) bool {
	nb := len(l.p.Windows)
	for i := range l.layout {
		if cost > l.p.Capacity(l.window(i), limitOf(in, nb, i), i >= nb) {
			return true
		}
	}
	return false
}

// ask sends op down the stack within the timeout; when the store fails,
// fail local asks the in-process store (not under a ceiling kept in a
// ledger). It returns the store that
// decided, nil when none did. now, when set, is the policy's clock read
// just before (the Op's deadline counts from it when that clock is the
// wall clock).
func (l *Limiter) ask(ctx context.Context, op *Op, now time.Time) (Reply, Store, error) {
	sctx, cancel := ctx, context.CancelFunc(nil)
	if l.p.Timeout > 0 {
		// The timeout bounds the store call whatever the client does; a
		// client that goes away does not abort (and so not fail) it.
		sctx = context.WithoutCancel(ctx)
		if l.b.Remote {
			// A remote store gives up at the Op's deadline itself (the
			// Redis store arms a timer it reuses), which spares every
			// request a context and its timer. On the wall clock: the
			// policy's clock may be another.
			if !l.wallClock || now.IsZero() {
				now = time.Now()
			}
			op.Deadline = now.Add(l.p.Timeout)
		} else {
			sctx, cancel = context.WithTimeout(sctx, l.p.Timeout)
		}
	}
	reply, err := l.stack.Do(sctx, op)
	if cancel != nil {
		cancel()
	}
	if err == nil {
		return reply, l.b.Store, nil
	}
	if l.p.Fail == FailLocal && l.b.Local != nil && l.g == nil {
		// Under a ceiling kept in a ledger (l.g), the in-process store has
		// no share of it, and asking the ledger from here would hide the
		// ask from the data centre's static-share wait: no local decision
		// (the caller's fail closed, a 503).
		local := *op
		local.Now, local.Deadline, local.nowIsWall = l.p.Now().UnixMicro(), time.Time{}, false
		if lr, lerr := l.b.Local.Do(ctx, &local); lerr == nil {
			return lr, l.b.Local, err
		}
	}
	return Reply{}, nil, err
}

// queueBudget tells the store how long the request would wait in the
// queue (what is left of MaxWait, when a waiter's place is free): a
// refusal within it is not counted toward the ban, as the request waits
// and is checked again; only its last refusal counts.
func (l *Limiter) queueBudget(op *Op, d *Decision) {
	q := l.p.Queue
	if op.Ban == nil || q.MaxWait <= 0 || l.p.DryRun || !d.Queued && l.waiters.Load() >= int64(q.MaxWaiters) {
		return
	}
	op.Ban.Wait = max(q.MaxWait-d.Waited, 0).Microseconds()
}

// wait lets a limited request wait for its turn when the queue allows it:
// its retry time fits in what is left of MaxWait, and a waiter's place is
// free (held until Decide returns). It reports whether the request waited
// and should be checked again.
func (l *Limiter) wait(ctx context.Context, d *Decision) bool {
	q := l.p.Queue
	if q.MaxWait <= 0 || l.p.DryRun || d.RetryAfter > q.MaxWait-d.Waited {
		return false
	}
	if !d.Queued {
		if l.waiters.Add(1) > int64(q.MaxWaiters) {
			l.waiters.Add(-1)
			return false
		}
		d.Queued = true
	}
	if l.sleep != nil {
		ok := l.sleep(ctx, d.RetryAfter)
		if ok {
			d.Waited += d.RetryAfter
		}
		return ok
	}
	t := time.NewTimer(d.RetryAfter)
	defer t.Stop()
	start := time.Now()
	select {
	case <-t.C:
		d.Waited += time.Since(start)
		return true
	case <-ctx.Done():
		// The client went away: no more waiting for it.
		d.Waited += time.Since(start)
		return false
	}
}

// windows builds the decision's windows from a reply (nil: unknown).
func (l *Limiter) windows(in *Input, op *Op, r *Reply) []WindowUsage {
	nb := len(l.p.Windows)
	out := op.usageBuf
	if len(out) < len(l.layout) {
		out = make([]WindowUsage, len(l.layout))
	}
	out, op.usageBuf = out[:len(l.layout):len(l.layout)], nil
	var wins [4 * MaxWindows]*Win
	n := 0
	for pi := range op.Parts {
		for j := range op.Parts[pi].Windows {
			wins[n] = &op.Parts[pi].Windows[j]
			n++
		}
	}
	for i := range out {
		win := l.window(i)
		limit := limitOf(in, nb, i)
		capacity := l.p.Capacity(win, limit, i >= nb)
		if r != nil && r.Limits != nil {
			// An override changed the limits.
			limit, capacity = r.Limits[l.layout[i]], r.Limits[l.layout[i]]
			if b := r.Bursts[l.layout[i]]; b > 0 {
				capacity = b
			}
		}
		w := WindowUsage{Policy: l.names[i], Window: win, Global: i >= nb, Limit: capacity}
		ow := wins[l.layout[i]]
		switch {
		case win.Period != PeriodNone:
			w.Seconds = ceilSeconds(time.Duration(periodLen(ow.Bounds, r)) * time.Microsecond)
		case l.p.Algorithm == TokenBucket:
			interval := max(int64(float64(ow.Len)/float64(limit)+0.5), 1)
			w.Seconds = ceilSeconds(time.Duration(capacity*interval) * time.Microsecond)
		default:
			w.Seconds = ceilSeconds(win.Duration)
		}
		if r != nil {
			u := r.Usage[l.layout[i]]
			// A cost above a capacity an override lowered is decided
			// before any window is read: their usage is not known.
			w.Known = !u.Unknown && r.Status != StatusTooLarge
			w.Count = u.Count
			w.Denied = u.Retry > 0 && r.Status != StatusAllowed
			w.Retry = time.Duration(u.Retry) * time.Microsecond
			w.Reset = time.Duration(u.Reset) * time.Microsecond
			if w.Denied {
				w.Reset = w.Retry
			} else {
				w.Remaining = max(capacity-u.Count, 0)
			}
		}
		out[i] = w
	}
	return out
}

// periodLen is the length (µs) of the period of bounds b that the store
// decided in: the one holding the reply's time (the store may be on
// another clock), or, without a reply, the one holding the caller's.
func periodLen(b [4]int64, r *Reply) int64 {
	switch {
	case r == nil || r.Now == 0:
	case r.Now >= b[2]:
		return b[3] - b[2]
	case r.Now < b[1]:
		return b[1] - b[0]
	}
	return b[2] - b[1]
}

func anyDenied(ws []WindowUsage) bool {
	for i := range ws {
		if ws[i].Denied {
			return true
		}
	}
	return false
}

// retryAfter is the time until the request would be admitted.
func retryAfter(d *Decision) time.Duration {
	var t time.Duration
	for i := range d.Windows {
		if d.Windows[i].Denied {
			t = max(t, d.Windows[i].Retry)
		}
	}
	switch d.Outcome {
	case OutcomeAllowed:
		return 0
	case OutcomeBanned:
		t = max(t, d.BanLeft)
	case OutcomeConcurrency:
		// No store knows when a request in flight ends: a second.
		t = max(t, time.Second)
	}
	return t
}

// finish applies jitter and the dry run.
func (l *Limiter) finish(d *Decision) {
	if d.Outcome != OutcomeAllowed && d.RetryAfter > 0 {
		if j := l.jitter(d.RetryAfter); j > 0 {
			d.RetryAfter += j
			for i := range d.Windows {
				if d.Windows[i].Denied {
					d.Windows[i].Retry += j
					d.Windows[i].Reset = d.Windows[i].Retry
				}
			}
		}
	}
	if l.p.DryRun && !d.Pass {
		d.Pass, d.DryRun = true, true
	}
}

func (l *Limiter) jitter(retry time.Duration) time.Duration {
	span := l.p.Jitter.Max
	if l.p.Jitter.Share > 0 {
		span = time.Duration(float64(retry) * l.p.Jitter.Share)
	}
	if span <= 0 {
		return 0
	}
	return time.Duration(mrand.Int64N(int64(span) + 1))
}

// Done finishes a request after its response: it releases the request's
// lease and, with count_only, records its units when status matches. It is
// safe to call on any decision, more than once, and from a defer (it runs
// when the handler panicked or the client went away).
func (l *Limiter) Done(ctx context.Context, d *Decision, status int) {
	p := d.done
	d.done = nil
	if p == nil || p.ended.Swap(true) {
		return // a copy of the decision was done already
	}
	defer l.flight.leave()
	ctx = context.WithoutCancel(ctx)
	if p.record && l.p.CountOnly(status) {
		rec := *p.op
		rec.Mode, rec.Lease, rec.Ban = ModeRecord, nil, nil
		rec.Deadline = time.Time{}
		if rec.Override == nil && hasKind(rec.Parts, KindToken) {
			// A token bucket's state keeps the limit it was written
			// under, so its record reads the identity's override as it is
			// at the response: one set since the check, or that this node
			// does not hear of (a limiter a reload replaced stops
			// listening), counts as it would for a check then.
			rec.Override = &OverrideRef{Key: l.overrideKey(p.id), Scope: l.scopeOf(p.region)}
		}
		if rec.Now != 0 {
			rec.Now = l.p.Now().UnixMicro()
		}
		for pi := range rec.Parts {
			if rec.Parts[pi].Kind != KindCalendar {
				continue
			}
			// The calendar periods of the time of the response.
			wins := append([]Win(nil), rec.Parts[pi].Windows...)
			for j := range wins {
				if per, ok := ParsePeriod(wins[j].Name); ok {
					wins[j].Bounds = per.Bounds(l.p.Now(), l.p.Location)
				}
			}
			rec.Parts = append([]Part(nil), rec.Parts...)
			rec.Parts[pi].Windows = wins
		}
		l.call(ctx, p.store, &rec)
	}
	if p.lease {
		rel := Op{Mode: ModeRelease, Lease: p.op.Lease}
		l.call(ctx, p.store, &rel)
	}
}

// hasKind reports whether a part of parts is of kind k.
func hasKind(parts []Part, k Kind) bool {
	for i := range parts {
		if parts[i].Kind == k {
			return true
		}
	}
	return false
}

// call runs an Op after the response within the timeout; an error is
// dropped here (a Breaker holds a release, or a record it did not send, for
// when its circuit closes; otherwise a lease expires by itself and
// count_only units are lost).
func (l *Limiter) call(ctx context.Context, s Store, op *Op) {
	if l.p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.p.Timeout)
		defer cancel()
	}
	_, _ = s.Do(ctx, op)
}

// Peek reports what a request would get, without recording anything or
// taking a lease: straight from the store behind any cache or breaker.
func (l *Limiter) Peek(ctx context.Context, in *Input) (Decision, error) {
	if err := l.checkInput(in); err != nil {
		return Decision{}, err
	}
	now := l.p.Now()
	op := l.op(in, ModePeek, now)
	d := Decision{Identity: in.Identity, Region: in.Region, Cost: op.Cost, InFlight: -1, Source: l.b.Source}
	if l.neverFits(in, op.Cost) {
		d.Outcome = OutcomeTooLarge
		d.Windows = l.windows(in, op, nil)
		return d, nil
	}
	if l.p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(l.p.Timeout, time.Second))
		defer cancel()
	}
	reply, err := l.b.Base.Do(ctx, op)
	if err != nil {
		return Decision{}, err
	}
	d.Windows = l.windows(in, op, &reply)
	d.Overridden = reply.Limits != nil
	d.InFlight = reply.InFlight
	d.BanLeft = time.Duration(reply.BanLeft) * time.Microsecond
	d.Banned = reply.Status == StatusBanned
	d.setOutcome(&reply)
	return d, nil
}

// setOutcome sets the outcome a store's reply means (d.Windows and
// d.Banned already read from it), whether the request passes, and the
// retry time.
func (d *Decision) setOutcome(r *Reply) {
	switch {
	case r.Status == StatusAllowed:
		d.Outcome, d.Pass = OutcomeAllowed, true
	case r.Status == StatusTooLarge:
		d.Outcome = OutcomeTooLarge
	case d.Banned:
		d.Outcome = OutcomeBanned
	case r.LeaseDenied && !anyDenied(d.Windows):
		d.Outcome = OutcomeConcurrency
	default:
		d.Outcome = OutcomeLimited
	}
	d.RetryAfter = retryAfter(d)
}

// Windows describes the windows of an Input (limits and lengths, no
// usage), as a Decision would list them.
func (l *Limiter) Windows(in *Input) ([]WindowUsage, error) {
	if err := l.checkInput(in); err != nil {
		return nil, err
	}
	return l.windows(in, l.op(in, ModePeek, l.p.Now()), nil), nil
}

// Reset forgets identity's budget in region (and its global ceiling, when
// the limiter has one): its windows and its ban, in the store, in the fail
// local store, and in the deny cache of every process sharing the store.
// It reports whether the other processes were told.
func (l *Limiter) Reset(ctx context.Context, identity, region string) (notified bool, err error) {
	keys := make([]string, len(l.specs))
	l.keys.Keys(keys, l.specs, identity, l.p.Regions, region)
	var drop []string
	for i, s := range l.specs {
		if s.Segment != "lease" {
			drop = append(drop, keys[i])
		}
	}
	// A reset forgets the budget whichever algorithm kept it: while a
	// reload that changes the algorithm rolls across the nodes, a reset
	// through a node still on the old one must clear the new one's state
	// too, and a later switch back must not bring back what was reset.
	var others []KeySpec
	for _, k := range []Kind{KindLog, KindCounter, KindFixed, KindToken, KindCalendar} {
		for _, global := range []bool{false, true} {
			if spec := (KeySpec{Segment: k.String(), Global: global}); !slices.Contains(l.specs, spec) &&
				(!global || len(l.p.GlobalWindows) > 0) {
				others = append(others, spec)
			}
		}
	}
	ok := make([]string, len(others))
	l.keys.Keys(ok, others, identity, l.p.Regions, region)
	drop = append(drop, ok...)
	if l.p.Ban != nil {
		// A reset lifts the key's ban whichever limiter it goes through:
		// an enforcing one's and a dry run's alike (a canary's DELETE
		// must lift the ban its enforcing nodes honour, and the other way
		// round).
		other := []KeySpec{{Segment: "dryban"}}
		if l.p.DryRun {
			other[0].Segment = "ban"
		}
		k := make([]string, 1)
		l.keys.Keys(k, other, identity, l.p.Regions, region)
		drop = append(drop, k[0])
	}
	if l.cache != nil {
		l.cache.Forget(Tag(identity))
	}
	if l.b.Local != nil {
		_ = l.b.Local.Reset(ctx, drop...)
	}
	if err := l.b.Base.Reset(ctx, drop...); err != nil {
		return false, err
	}
	// A denial decided before the reset and cached after it is dropped by
	// the notice, on this process too.
	return l.forgetDenials(ctx, Tag(identity)), nil
}

// forgetDenials drops the denials of tag cached here and, by a notice, on
// every node sharing the store; it reports whether the notice went out.
func (l *Limiter) forgetDenials(ctx context.Context, tag string) bool {
	if l.cache != nil {
		l.cache.Forget(tag)
	}
	if l.b.Notifier == nil {
		return false
	}
	return l.b.Notifier.Publish(ctx, l.channel, l.keys.Namespace()+"\n"+tag) == nil
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
