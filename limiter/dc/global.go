package dc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Global is a global ceiling kept in a ledger every data centre shares
// (global_redis): Backend.Global. The data centre's store keeps its share of
// each identity's ceiling (grants from the ledger), checked with the
// region's windows in one call; grants are asked for ahead of need, in the
// background, and only an identity's first request in a data centre (or one
// whose share ran out while the ledger had room) waits for the ledger.
type Global struct {
	Ledger *Ledger
	// Datacenter names this node's data centre (datacenter).
	Datacenter string
	// Timeout bounds one call of the ledger (default 1 s).
	Timeout time.Duration
	// Length is a grant's base length (default: the shortest global window
	// / 60, within 50 ms and 1 s): longer when the ledger has room to spare.
	Length time.Duration
	// Beat is how long the data centre's membership lasts after the ledger
	// heard it (fail local; default 2 s); Skew the clocks' skew allowed
	// (default 1 s).
	Beat, Skew time.Duration
	// OnEvent, when set, is told of every ledger call and decision the
	// ceiling changed (metrics).
	OnEvent func(GlobalEvent)
}

// GlobalEvent is one thing the global ceiling did.
type GlobalEvent struct {
	Kind GlobalEventKind
	// Units granted (EventGrant) or given back unused (EventReturn), and a
	// grant's Length (usable here until Length after the renewal began);
	// Retry (EventGrant), how long the ledger said it would grant no more
	// (0: it granted what was asked); Took, a ledger call's round trip;
	// Err, its error.
	Units  int64
	Length time.Duration
	Retry  time.Duration
	Took   time.Duration
	Err    error
}

// GlobalEventKind is what happened.
type GlobalEventKind uint8

// The events.
const (
	// EventGrant: a ledger call (grant or renewal) answered (Units granted,
	// maybe 0); EventLedgerError: one failed.
	EventGrant GlobalEventKind = iota
	EventLedgerError
	// EventReturn: Units given back to the ledger.
	EventReturn
	// EventRenewal: a renewal ahead of need started (in the background).
	EventRenewal
	// EventStarved: a request refused here while the ledger had room.
	EventStarved
	// EventFailOpen: a request passed by fail open without the ledger.
	EventFailOpen
	// EventStatic: the data centre went to its static share; EventNormal:
	// it came back.
	EventStatic
	EventNormal
	// EventBeat: the membership was renewed (Took).
	EventBeat
	// EventWait: a request whose share the ledger had already answered
	// for waited on the request path for a renewal (Took; Err when it was
	// late: a refusal while the renewal is within the ledger's timeout, the
	// fail mode after). An identity's first request in a data centre,
	// which waits for its first grant, is not one.
	EventWait
	// EventDropped: this node dropped its data centre's share of an
	// identity, as an operator's reset through another data centre asked
	// (Err: the drop failed, and was tried again every 250 ms until
	// every grant the share could hold had ended, or the node closed).
	EventDropped
)

// Host is what the data-centre code needs of the engine, handed to it at
// New: the engine calls the data-centre code (Ceiling), never the other
// way round.
type Host struct {
	Namespace string           // the limiter's key namespace
	FailLocal bool             // the policy's fail mode is fail local
	Now       func() time.Time // the policy's clock
	CountOnly bool             // the policy records after the response (refused)
	Store     ShareStore       // the data centre's own store (nil: it keeps no shares; refused)
	// Windows are the policy's global windows; Pos their places in a
	// request's Applied limits; Order the share part's windows, as indexes
	// into Windows.
	Windows    []Window
	Pos, Order []int
	// Tag is the hash tag of an identity's keys; ShareKey the key of its
	// share; Forget drops an identity's cached denials (nil: no deny
	// cache); Unavailable reports whether an error says the ledger cannot
	// serve at all (an outage, not one call's error).
	Tag         func(identity string) string
	ShareKey    func(identity string) string
	Forget      func(tag string)
	Unavailable func(err error) bool
	// Drop deletes an identity's share (key) in the data centre's store,
	// and drops its cached denials on every node of the data centre (an
	// operator's reset through another data centre).
	Drop func(ctx context.Context, tag, key string) error
}

// Window is one of the policy's global windows, as the ledger counts it.
type Window struct {
	// Name is the window's name in the ledger: its length in µs, or the
	// calendar period's name.
	Name string
	// Len is a duration window's length (0: a calendar period), Longest
	// the most the window spans (its length, or the period's longest).
	Len, Longest time.Duration
	// Bounds is, for a calendar period, the starts of three periods in a
	// row around now and the end of the third (nil otherwise).
	Bounds func(now time.Time) [4]int64
}

// Request is what the data-centre code needs of one request.
type Request struct {
	// Identity is whose ceiling the request spends; Cost its units.
	Identity string
	Cost     int64
	// Limits are the global limits (of Host.Windows, in order); Applied,
	// when an override changed a limit, every window's limit as the store
	// decided (the engine's reply's, the global ones at Host.Pos), nil
	// otherwise.
	Limits, Applied []int64
	// Renew: the store gave this request the claim to renew the share.
	Renew bool
}

// Ceiling is a limiter's side of a Global: the engine's ceiling.
type Ceiling struct {
	h   Host
	cfg Global
	dc  ShareStore

	length, beat, skew, timeout int64 // µs
	wmax, glenMax               int64

	rtt    atomic.Int64 // µs, the ledger's round trip (an average)
	took   atomic.Int64 // µs, a renewal from its start to its deposit (an average)
	static atomic.Bool
	// down: the last call of the ledger failed (a short share then follows
	// the fail mode, not a refusal).
	down atomic.Bool
	// suspect (fail local): a call of the ledger failed; until a probe
	// (PING, which changes nothing there) answers, this node sends the
	// ledger nothing that could renew the data centre's membership, so
	// that the static share's wait, counted from the last such call, ends.
	suspect atomic.Bool
	polled  atomic.Int64 // UnixMicro of the last read of the standing
	n       atomic.Int64 // data centres the ledger knows
	asked   atomic.Int64 // UnixMicro of this node's last grant call

	mu       sync.Mutex
	renewing map[string]*shareCall
	closed   bool // close began: no renewal starts (mu)
	// drops: the shares a reset asked this node to drop, not dropped yet,
	// by share key (mu). Each is tried at once, then every recall tick
	// (250 ms) until it is dropped, or until every grant it may hold has
	// ended (then it is a failed drop, EventDropped with Err), or the node
	// closes (so too).
	drops map[string]*pendingDrop

	queue chan renewal
	stop  chan struct{}
	wg    sync.WaitGroup

	hook atomic.Pointer[func(stage string)] // a test's (SetHook): "granted", between the ledger's grant and its deposit, and "deposited"; set while renewals run
}

type pendingDrop struct {
	tag   string
	until int64 // UnixMicro: the share's grants have all ended by then
	busy  bool  // a try is under way
	err   error // the last failed try's
	// n: the resets whose drop has not landed (a try that lands covers
	// those counted when it began).
	n int
}

type shareCall struct {
	done  chan struct{}
	err   error
	start time.Time // when it began: it is due a lead after
}

// errLedgerLate: a renewal the request waited for was not back within the
// ledger's timeout (or the ledger's last call failed).
var errLedgerLate = fmt.Errorf("%w (a renewal was not back within the timeout)", ErrLedgerUnreachable)

// ErrLedgerSlow: a renewal the request waited for was not back when due (a
// lead after it began) but is still within the ledger's timeout, and the
// ledger's last call answered: the ledger is slow, not down. The request
// is refused (the share's 429, Retry-After the lead), not the fail mode.
var ErrLedgerSlow = errors.New("limiter: a renewal of the share is slower than its lead")

type renewal struct {
	tag, key, sig string
	win           []LedgerWindow
	// recall: the ledger recalled the share's unspent grants (every live
	// one ends, and goes back with this renewal).
	recall bool
	cost   int64 // the cost of the request that queued it: the least worth asking for
}

// ticket is what a renewal needs, as the ledger keeps it for a recall.
// Reset is 1 in a reset's recall (ledger.lua writes it first, "{\"x\":1,"):
// the share is dropped, not given back; a node of a release before it
// reads that ticket as a recall's, which ends the share's live grants.
type ticket struct {
	Reset int            `json:"x,omitempty"`
	Tag   string         `json:"t"`
	Key   string         `json:"k"`
	Sig   string         `json:"s"`
	Win   []LedgerWindow `json:"w"`
}

// shareRecheck is how long a share the ledger had no room for waits at
// most before it asks again (while requests want it): the ledger hears its
// demand within its 2 s, keeps its fair part for it, and recalls others'
// unspent grants.
const shareRecheck = time.Second

// recallEvery is how often a node asks the ledger for its data centre's
// recalls, while it asked the ledger within the longest window and two
// grants (8 times as rarely otherwise: another node's grants).
const recallEvery = 250 * time.Millisecond

// ErrStatic: the data centre is in static mode (a node found it cut off).
var ErrStatic = errors.New("limiter: the data centre is on its static share")

// ErrLedgerUnreachable: a call of the ledger failed, and this node waits
// for it to answer a probe before it asks again.
var ErrLedgerUnreachable = errors.New("limiter: the ledger did not answer; waiting for it to answer again")

// New starts the data-centre side of a limiter under cfg: its renewers,
// recaller and (fail local) beater, until Close. Its errors are the
// policy's (global_redis).
func New(h Host, cfg Global) (*Ceiling, error) {
	if cfg.Ledger == nil || cfg.Datacenter == "" {
		return nil, errors.New("global_redis needs a ledger and a datacenter")
	}
	if h.Store == nil {
		return nil, ErrNoShareStore
	}
	if len(h.Windows) == 0 {
		return nil, errors.New("global_redis keeps a global_limit: set one")
	}
	if h.CountOnly {
		return nil, errors.New("count_only cannot keep a ceiling across data centres exactly (it records after the response): drop one of them")
	}
	g := &Ceiling{h: h, cfg: cfg, dc: h.Store, renewing: map[string]*shareCall{}, drops: map[string]*pendingDrop{}, queue: make(chan renewal, 1024), stop: make(chan struct{})}
	shortest, wmax := time.Duration(0), time.Duration(0)
	for _, w := range h.Windows {
		d := w.Longest
		if shortest == 0 || d < shortest {
			shortest = d
		}
		wmax = max(wmax, d)
	}
	if cfg.Length == 0 {
		cfg.Length = min(max(shortest/60, 50*time.Millisecond), time.Second)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Beat == 0 {
		cfg.Beat = 2 * time.Second
	}
	if cfg.Skew == 0 {
		cfg.Skew = time.Second
	}
	g.cfg = cfg
	g.length, g.beat, g.skew, g.timeout = cfg.Length.Microseconds(), cfg.Beat.Microseconds(), cfg.Skew.Microseconds(), cfg.Timeout.Microseconds()
	g.wmax = wmax.Microseconds()
	g.glenMax = max(g.length, min(16*g.length, shortest.Microseconds()/2))
	g.rtt.Store(g.timeout / 10) // a first guess; each call's round trip corrects it
	for range 4 {
		g.wg.Add(1)
		go g.renewer()
	}
	g.wg.Add(1)
	go g.recaller()
	if h.FailLocal {
		g.wg.Add(1)
		go g.beater()
	}
	return g, nil
}

// Close stops the ceiling's goroutines, and waits for them and for the
// renewals requests started (each in g.wg, added under g.mu before closed).
func (g *Ceiling) Close() {
	g.mu.Lock()
	g.closed = true
	close(g.stop)
	g.mu.Unlock()
	g.wg.Wait()
	// The drops still failing are given up: counted as failed.
	g.mu.Lock()
	left := g.drops
	g.drops = map[string]*pendingDrop{}
	g.mu.Unlock()
	for _, d := range left {
		g.Event(GlobalEvent{Kind: EventDropped, Err: fmt.Errorf("limiter: closed before a reset's drop succeeded: %w", d.failure())})
	}
}

// stopped reports whether close began: a renewal that finds it so deposits
// only into a share under its own limits (Deposit.Only), as the limiter
// that asked for it is gone (a reload), and a new one's grants, under the
// new limits, may be in the share.
func (g *Ceiling) stopped() bool {
	select {
	case <-g.stop:
		return true
	default:
		return false
	}
}

func (g *Ceiling) Event(ev GlobalEvent) {
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent(ev)
	}
}

// Lead is how far ahead of need a share is renewed: two renewals, each as
// long as the ledger's round trip or, when longer, as a renewal took here
// from its start to its deposit (the data centre's Redis and the ledger,
// when they queue), and a margin. The share holds what its demand spends
// in that time.
func (g *Ceiling) Lead() int64 { return 2*max(g.rtt.Load(), g.took.Load()) + 20_000 }

// Claim is how long a renewal's claim lasts: every call it makes, within
// their timeouts.
func (g *Ceiling) Claim() int64 { return 2*g.timeout + 200_000 }

// UsesStatic reports whether requests go to the static share now: the data
// centre is in static mode, as read within staticFresh.
func (g *Ceiling) UsesStatic() bool {
	return g.static.Load() && time.Now().UnixMicro()-g.polled.Load() < g.staticFresh()
}

// staticFresh is how old a read of the standing may be for a request to
// use the static share: a beat's round of reads, each after a probe that
// may take the timeout. The ledger keeps a data centre's static share
// reserved that long (and the skew) after the data centre is heard again.
func (g *Ceiling) staticFresh() int64 { return g.beat/2 + 2*g.timeout }

// staticWait is how long no node of the data centre has asked the ledger
// before the static share may be used: a membership (and a late call), then
// every grant the ledger made before it lapsed has left every window.
func (g *Ceiling) staticWait() int64 {
	return g.beat + 2*g.timeout + g.glenMax + g.wmax + g.skew
}

// heard is the least time from the last call of this data centre the
// ledger heard until the data centre may be on its static share: the
// static wait counts from the last ask recorded in the data centre's store,
// which is before that call by at most the store's read and the call's
// deadline (4 timeouts: renew's), and the clocks' error (a skew, twice).
// A data centre heard again sooner was never on its static share, and the
// ledger reserves nothing for it after.
func (g *Ceiling) heard() int64 { return max(g.staticWait()-4*g.timeout-2*g.skew, 0) }

// StaticLimit is the static share of a limit: the limit over the data
// centres the ledger knew (0: none).
func (g *Ceiling) StaticLimit(limit int64) int64 {
	n := g.n.Load()
	if n <= 0 {
		return 0
	}
	return limit / n
}

// StaticNone reports whether the static share of one of a request's
// global limits is nothing (fewer units than data centres).
func (g *Ceiling) StaticNone(limits []int64) bool {
	for _, v := range limits {
		if g.StaticLimit(v) == 0 {
			return true
		}
	}
	return false
}

func (g *Ceiling) request(tag string) *LedgerRequest {
	return &LedgerRequest{
		Namespace: g.h.Namespace, Tag: tag, DC: g.cfg.Datacenter,
		Deadline: time.Now().Add(g.cfg.Timeout),
		QWait:    g.wmax + g.glenMax + g.skew + g.timeout, Skew: g.skew, Beat: g.beat, WMax: g.wmax,
		Tail: g.staticFresh() + g.skew, Heard: g.heard(),
		Static: g.h.FailLocal,
	}
}

func (g *Ceiling) standingKey() string { return g.h.Namespace + "ledger:standing" }

// windows is the ceiling's windows for the ledger, under the limits of the
// request (an override's, when the store applied one).
func (g *Ceiling) windows(req *Request) []LedgerWindow {
	now := g.h.Now()
	out := make([]LedgerWindow, 0, len(g.h.Windows))
	for i, w := range g.h.Windows {
		lw := LedgerWindow{Name: w.Name, Limit: req.Limits[i]}
		if req.Applied != nil {
			lw.Limit = req.Applied[g.h.Pos[i]]
		}
		if w.Bounds != nil {
			lw.Calendar, lw.Bounds = true, w.Bounds(now)
		} else {
			lw.Len = w.Len.Microseconds()
		}
		out = append(out, lw)
	}
	return out
}

// Fetch renews the share of req's identity now (one per identity at a
// time in this process: a second caller waits for the first).
func (g *Ceiling) Fetch(ctx context.Context, req Request, key string, cost int64) error {
	tag := g.h.Tag(req.Identity)
	g.mu.Lock()
	if c := g.renewing[tag]; c != nil {
		g.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &shareCall{done: make(chan struct{}), start: time.Now()}
	g.renewing[tag] = c
	g.mu.Unlock()
	c.err = g.renew(ctx, tag, key, Sig(req.Limits), g.windows(&req), cost, false)
	g.mu.Lock()
	delete(g.renewing, tag)
	g.mu.Unlock()
	close(c.done)
	return c.err
}

// Await waits for the renewal of req's share in flight on this node (or one
// it starts now, in the background) until it is done or due (a lead after
// it began: asked ahead of need, it should be back by then). Late, it
// returns errLedgerLate when the ledger is down (its last call failed) or
// the renewal has been out the ledger's timeout (the fail mode), and
// ErrLedgerSlow otherwise (a refusal); the renewal goes on.
func (g *Ceiling) Await(ctx context.Context, req Request, key string, cost int64) error {
	tag := g.h.Tag(req.Identity)
	g.mu.Lock()
	c := g.renewing[tag]
	if c == nil && g.closed {
		g.mu.Unlock()
		return errLedgerLate // closed: no renewal outlives the limiter
	}
	if c == nil {
		// None here (the claim is another node's, or its renewal waits
		// for a worker): this request's own, as the first request's, in
		// g.wg (close waits for it).
		c = &shareCall{done: make(chan struct{}), start: time.Now()}
		g.renewing[tag] = c
		sig, wins := Sig(req.Limits), g.windows(&req)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			c.err = g.renew(context.Background(), tag, key, sig, wins, max(cost, 1), false)
			g.mu.Lock()
			delete(g.renewing, tag)
			g.mu.Unlock()
			close(c.done)
		}()
	} else if req.Renew {
		// A claim taken while a renewal is in flight (its deposit let this
		// one claim): renewed after it, in the background.
		g.Later(req)
	}
	g.mu.Unlock()
	sent := time.Now()
	due := time.Until(c.start.Add(time.Duration(g.Lead()) * time.Microsecond))
	var err error
	if due <= 0 {
		err = g.late(c)
	} else {
		t := time.NewTimer(due)
		select {
		case <-c.done:
			err = c.err
		case <-t.C:
			err = g.late(c)
		case <-ctx.Done():
			err = ctx.Err()
		}
		t.Stop()
	}
	g.Event(GlobalEvent{Kind: EventWait, Took: time.Since(sent), Err: err})
	return err
}

// late is what a request gets when the renewal c it waited for is not back
// when due: the fail mode (errLedgerLate) once the ledger is known down or
// c has been out the ledger's timeout; before that the ledger is slow, not
// down (ErrLedgerSlow: the share's refusal).
func (g *Ceiling) late(c *shareCall) error {
	if g.down.Load() || time.Since(c.start) >= g.cfg.Timeout {
		return errLedgerLate
	}
	return ErrLedgerSlow
}

// renew is one renewal: read the share (recall: ending its live grants
// first), ask the ledger (returning the grants that ended), keep what it
// grants.
func (g *Ceiling) renew(ctx context.Context, tag, key, sig string, wins []LedgerWindow, cost int64, recall bool) error {
	began := time.Now()
	if g.suspect.Load() {
		g.down.Store(true)
		return ErrLedgerUnreachable
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*g.cfg.Timeout)
	defer cancel()
	reset, err := g.renewOnce(ctx, tag, key, sig, wins, cost, recall, began)
	if reset && !recall {
		// The share was reset (an operator's) since this renewal read it,
		// and nothing landed: once more, on the share as it is now, so
		// that the requests waiting for this renewal find what the ledger
		// grants after the reset. (A recall's is moot: the reset ended its
		// grants.)
		_, err = g.renewOnce(ctx, tag, key, sig, wins, cost, false, began)
	}
	return err
}

// renewOnce is one pass of a renewal; reset reports that its deposit found
// the share reset since its read (nothing landed).
func (g *Ceiling) renewOnce(ctx context.Context, tag, key, sig string, wins []LedgerWindow, cost int64, recall bool, began time.Time) (reset bool, err error) {
	if _, ok, err := g.dc.StandingDo(ctx, g.standingKey(), "send", 0); err != nil {
		return false, err
	} else if !ok {
		g.static.Store(true)
		g.polled.Store(time.Now().UnixMicro())
		return false, ErrStatic
	}
	view, err := g.dc.ShareBegin(ctx, key, sig, recall)
	if err != nil || view.Stale {
		return false, err
	}
	req := g.grantRequest(tag, wins, &view, cost)
	req.Ticket = g.ticket(tag, key, sig, wins)
	rep, took, err := g.ask(ctx, req)
	if err != nil && !errors.Is(err, ErrLedgerNotDurable) {
		_, _ = g.dc.ShareDeposit(ctx, key, Deposit{T0: view.Now, Sig: sig, Only: g.stopped(), Inc: view.Inc})
		return false, err
	}
	dep := g.deposit(&view, req, &rep, sig, err == nil)
	g.Event(GlobalEvent{Kind: EventGrant, Units: dep.Units, Length: time.Duration(dep.Length) * time.Microsecond,
		Retry: time.Duration(rep.Retry) * time.Microsecond, Took: took, Err: err})
	if h := g.hook.Load(); h != nil {
		(*h)("granted")
	}
	dep.Only = g.stopped()
	slot, derr := g.dc.ShareDeposit(ctx, key, dep)
	if derr != nil {
		return false, derr
	}
	if h := g.hook.Load(); h != nil {
		(*h)("deposited")
	}
	if slot < 0 {
		return true, err
	}
	if err != nil {
		return false, err
	}
	g.renewed(time.Since(began))
	if dep.Units > 0 && g.h.Forget != nil {
		g.h.Forget(tag)
	}
	return false, nil
}

// grantRequest is the ledger call of a renewal: what the share's demand
// asks for until the next renewal, less what it holds, and its grants that
// ended, given back.
func (g *Ceiling) grantRequest(tag string, wins []LedgerWindow, view *ShareView, cost int64) *LedgerRequest {
	req := g.request(tag)
	req.Windows = wins
	req.Rate = view.Rate
	// A grant is usable here from its arrival, half a round trip after the
	// ledger made it, to Length after view.Now, half a round trip before:
	// the base length, and the round trip.
	req.Length = g.length + 2*g.rtt.Load()
	want := max(cost, (view.Rate*(g.length+g.Lead())+999_999)/1_000_000)
	var live int64
	open := 0
	for _, gr := range view.Grants {
		if gr.Closed(view.Now) {
			last := int64(0)
			if gr.Last > 0 {
				last = gr.Last - gr.Start
			}
			req.Returns = append(req.Returns, LedgerReturn{ID: gr.ID, Used: gr.Used, Last: last})
		} else {
			live += gr.Units - gr.Used
			open++
			if gr.Used > 0 {
				req.Used = append(req.Used, LedgerReturn{ID: gr.ID, Used: gr.Used})
			}
		}
	}
	req.Want = max(want-live, cost)
	req.Least = max(cost-live, 1)
	if cost == 0 {
		req.Least = 0 // a recall's: it asks for nothing it has no demand for
	}
	if open >= Slots {
		// Every slot holds a live grant: one more would have nowhere to go
		// (the ledger would count it, nothing would use it). Only give back.
		req.Want = 0
	}
	return req
}

// ask calls the ledger within the timeout (the first call learns its clock
// first, in a timeout of its own), and keeps its round trip.
func (g *Ceiling) ask(ctx context.Context, req *LedgerRequest) (LedgerReply, time.Duration, error) {
	sent := time.Now()
	if !g.cfg.Ledger.clock.Known() {
		lctx, lcancel := context.WithTimeout(ctx, g.cfg.Timeout)
		_ = g.cfg.Ledger.learn(lctx)
		lcancel()
	}
	lctx, lcancel := context.WithTimeout(ctx, g.cfg.Timeout)
	rep, err := g.cfg.Ledger.Do(lctx, "grant", req)
	lcancel()
	took := time.Since(sent)
	if err != nil && !errors.Is(err, ErrLedgerNotDurable) {
		g.Event(GlobalEvent{Kind: EventLedgerError, Took: took, Err: err})
		g.down.Store(true)
		if g.h.FailLocal && g.h.Unavailable(err) {
			g.suspect.Store(true)
		}
		return rep, took, err
	}
	g.down.Store(false)
	g.asked.Store(time.Now().UnixMicro())
	g.rtt.Store((3*g.rtt.Load() + took.Microseconds()) / 4)
	if rep.N > 0 {
		g.n.Store(rep.N)
	}
	return rep, took, err
}

// deposit is what the renewal writes into the share: the grants given
// back go, the new grant (when durable) comes, and until when the ledger
// has no room.
func (g *Ceiling) deposit(view *ShareView, req *LedgerRequest, rep *LedgerReply, sig string, durable bool) Deposit {
	for _, gr := range view.Grants {
		if gr.Closed(view.Now) {
			g.Event(GlobalEvent{Kind: EventReturn, Units: gr.Units - gr.Used})
		}
	}
	dep := Deposit{T0: view.Now, Retry: rep.Retry, Sig: sig, Counts: g.shareCounts(rep.Counts), Recheck: shareRecheck.Microseconds(), Inc: view.Inc}
	for _, r := range req.Returns {
		dep.Returned = append(dep.Returned, r.ID)
	}
	if durable && rep.Units > 0 {
		dep.Units, dep.Length, dep.ID = rep.Units, rep.Length, rep.ID
	}
	if dep.Retry > 1000 {
		// The ledger has room again after Retry (the first unit counted
		// leaves the window, or the fair rate's bucket holds a grant's
		// length of units again); the share has it once a renewal asked
		// then lands (the share asks a lead before "f"): until then its
		// short requests are refused at once, saying so. Without the lead
		// here for want of room, the share asked before the room was back,
		// and requests in the moment between the room and the renewal
		// waited for it on the request path (TestGlobalNoRequestWaitsOnTheLedger:
		// 2 to 3 of 240, 0 with it). (1 ms, the least, is a grant capped
		// short of its want: not full, the share asks again when it runs
		// low.)
		dep.Retry += g.Lead()
	}
	if rep.Waiting {
		dep.Retry = max(rep.Retry, 1000)
	}
	return dep
}

// Later queues a renewal ahead of need; a full queue drops it (the claim
// expires, and a later request claims again).
func (g *Ceiling) Later(req Request) {
	rn := renewal{tag: g.h.Tag(req.Identity), key: g.h.ShareKey(req.Identity), sig: Sig(req.Limits), win: g.windows(&req), cost: max(req.Cost, 1)}
	select {
	case g.queue <- rn:
		g.Event(GlobalEvent{Kind: EventRenewal})
	default:
	}
}

func (g *Ceiling) renewer() {
	defer g.wg.Done()
	for {
		select {
		case <-g.stop:
			return
		case rn := <-g.queue:
			tag, key := rn.tag, rn.key
			// The request that queued this renewal holds the claim: it
			// runs, after the renewal in flight for the identity (whose
			// deposit may have let this one claim), never instead of it.
			// A recall asks for no unit it has no demand for.
			c := g.take(tag)
			if c == nil {
				return
			}
			cost := rn.cost
			if rn.recall {
				cost = 0
			}
			c.err = g.renew(context.Background(), tag, key, rn.sig, rn.win, cost, rn.recall)
			g.mu.Lock()
			delete(g.renewing, tag)
			g.mu.Unlock()
			close(c.done)
		}
	}
}

// renewed keeps a renewal's time, from its start to its deposit (an
// average, for the lead; a call's timeout at most).
func (g *Ceiling) renewed(d time.Duration) {
	g.took.Store((3*g.took.Load() + min(d.Microseconds(), g.timeout)) / 4)
}

// ticket is the renewal of a share as the ledger keeps it for a recall.
func (g *Ceiling) ticket(tag, key, sig string, wins []LedgerWindow) string {
	b, _ := json.Marshal(ticket{Tag: tag, Key: key, Sig: sig, Win: wins})
	return string(b)
}

// recaller asks the ledger, every recallEvery, for the shares it recalled
// from this data centre (another one was refused for want of room), and
// queues a renewal of each that gives its unspent grants back.
func (g *Ceiling) recaller() {
	defer g.wg.Done()
	t := time.NewTicker(recallEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.retryDrops()
			recent := time.Now().UnixMicro()-g.asked.Load() < g.wmax+2*g.glenMax
			if (recent || i%8 == 0) && !g.suspect.Load() {
				g.recallOnce()
			}
		}
	}
}

func (g *Ceiling) recallOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
	defer cancel()
	tickets, err := g.cfg.Ledger.Recalls(ctx, g.request(""))
	if err != nil {
		return // the ledger's renewals and beats see it too
	}
	for _, s := range tickets {
		var tk ticket
		if json.Unmarshal([]byte(s), &tk) != nil || tk.Tag == "" || tk.Key == "" {
			continue
		}
		if tk.Reset != 0 {
			// An operator's reset through another data centre: the share
			// goes at once, not queued behind renewals (it may be spending
			// grants the ledger forgot). A renewal in flight here finds it
			// gone at its deposit (another incarnation) and asks again.
			// Its grants were made before the reset, each within the
			// longest grant's length (and the clocks' skew) of now.
			g.mu.Lock()
			d := g.drops[tk.Key]
			if d == nil {
				d = &pendingDrop{tag: tk.Tag}
				g.drops[tk.Key] = d
			}
			d.n, d.until = d.n+1, max(d.until, time.Now().UnixMicro()+g.glenMax+g.skew)
			if !d.busy {
				g.tryDrop(tk.Key, d)
			}
			g.mu.Unlock()
			continue
		}
		select {
		case g.queue <- renewal{tag: tk.Tag, key: tk.Key, sig: tk.Sig, win: tk.Win, recall: true}:
		default: // a full queue: its grants come back when they end
		}
	}
}

// retryDrops tries each share to drop whose try failed once more (each
// at most once at a time), and gives up those whose grants have all ended.
func (g *Ceiling) retryDrops() {
	now := time.Now().UnixMicro()
	var failed []error
	g.mu.Lock()
	for key, d := range g.drops {
		switch {
		case d.busy:
		case now >= d.until:
			delete(g.drops, key)
			failed = append(failed, d.failure())
		case !g.closed:
			g.tryDrop(key, d)
		}
	}
	g.mu.Unlock()
	for _, err := range failed {
		g.Event(GlobalEvent{Kind: EventDropped, Err: err})
	}
}

// tryDrop drops the share at key in the background (under g.mu; d not
// busy): once it lands, the resets counted in d when it began are done
// (EventDropped), and d goes with the last of them; a failed try stays
// for retryDrops.
func (g *Ceiling) tryDrop(key string, d *pendingDrop) {
	d.busy = true
	n := d.n
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := g.drop(d.tag, key)
		g.mu.Lock()
		d.busy = false
		if err != nil {
			d.err = err
		} else if d.n -= n; d.n <= 0 {
			delete(g.drops, key)
		}
		g.mu.Unlock()
		if err == nil {
			g.Event(GlobalEvent{Kind: EventDropped})
		}
	}()
}

func (d *pendingDrop) failure() error {
	if d.err == nil {
		return errors.New("limiter: a reset's drop not tried before its node closed")
	}
	return d.err
}

// drop deletes the identity's share here, as an operator's reset through
// another data centre asked (its grants were of the state the ledger
// forgot): twice at most, each within the timeout.
func (g *Ceiling) drop(tag, key string) error {
	var err error
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
		err = g.h.Drop(ctx, tag, key)
		cancel()
		if err == nil {
			break
		}
	}
	return err
}

// Reset forgets identity's grants in the ledger (an operator's reset
// through this node), and has every other data centre that held a share of
// it drop that share (within a recall's round, recallEvery, and a round
// trip, while it asks for the identity); this data centre's share is the
// caller's to reset. It returns how many data centres were told.
func (g *Ceiling) Reset(ctx context.Context, identity string) (int64, error) {
	req := g.request(g.h.Tag(identity))
	return g.cfg.Ledger.Reset(ctx, req)
}

// take makes this goroutine the identity's renewal in flight, once the
// one in flight (if any) is done; nil when the global stops first.
func (g *Ceiling) take(tag string) *shareCall {
	for {
		g.mu.Lock()
		busy := g.renewing[tag]
		if busy == nil {
			c := &shareCall{done: make(chan struct{}), start: time.Now()}
			g.renewing[tag] = c
			g.mu.Unlock()
			return c
		}
		g.mu.Unlock()
		select {
		case <-busy.done:
		case <-g.stop:
			return nil
		}
	}
}

// beater keeps the data centre's membership (fail local): every quarter
// beat it tells the ledger it is here; when it cannot, and no node of the
// data centre could for long enough, the data centre goes to its static
// share, and back when the ledger answers again.
func (g *Ceiling) beater() {
	defer g.wg.Done()
	t := time.NewTicker(time.Duration(g.beat/4) * time.Microsecond)
	defer t.Stop()
	g.beatOnce()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.beatOnce()
		}
	}
}

func (g *Ceiling) beatOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*g.cfg.Timeout)
	defer cancel()
	key := g.standingKey()
	if g.suspect.Load() {
		g.toStatic(ctx, key)
		pctx, pcancel := context.WithTimeout(ctx, g.cfg.Timeout)
		sent := time.Now()
		err := g.cfg.Ledger.Ping(pctx)
		pcancel()
		if err != nil {
			// A failed probe is a ledger error too: operators see the
			// data centre still cut off.
			g.Event(GlobalEvent{Kind: EventLedgerError, Took: time.Since(sent), Err: err})
			return
		}
		g.suspect.Store(false)
	}
	_, ok, err := g.dc.StandingDo(ctx, key, "send", 0)
	if err != nil {
		return // the data centre's store is down: its own fail mode applies
	}
	req := g.request("")
	req.WasStatic = !ok
	sent := time.Now()
	lctx, lcancel := context.WithTimeout(ctx, g.cfg.Timeout)
	rep, err := g.cfg.Ledger.Do(lctx, "beat", req)
	lcancel()
	took := time.Since(sent)
	if err == nil {
		g.down.Store(false)
		g.Event(GlobalEvent{Kind: EventBeat, Took: took})
		g.n.Store(rep.N)
		op := "poll"
		if !ok {
			op = "normal"
		}
		st, _, serr := g.dc.StandingDo(ctx, key, op, rep.N)
		if serr == nil {
			g.setStanding(st)
		}
		return
	}
	g.Event(GlobalEvent{Kind: EventLedgerError, Took: took, Err: err})
	if g.h.Unavailable(err) {
		g.suspect.Store(true)
	}
	g.toStatic(ctx, key)
}

// toStatic asks the data centre's store for static mode: it starts once no
// node of the data centre asked the ledger for the static wait.
func (g *Ceiling) toStatic(ctx context.Context, key string) {
	st, _, err := g.dc.StandingDo(ctx, key, "static", g.staticWait())
	if err == nil {
		g.setStanding(st)
	}
}

func (g *Ceiling) setStanding(st Standing) {
	was := g.static.Swap(st.Static)
	g.polled.Store(time.Now().UnixMicro())
	if st.N > 0 {
		g.n.Store(st.N)
	}
	if st.Static && !was {
		g.Event(GlobalEvent{Kind: EventStatic})
	} else if !st.Static && was {
		g.Event(GlobalEvent{Kind: EventNormal})
	}
}

func (g *Ceiling) String() string { return fmt.Sprintf("global(%s)", g.cfg.Datacenter) }

// Sig is the signature of a request's global limits: grants made under
// other limits (before a reload, another placeholder value) are not used
// under these.
func Sig(limits []int64) string {
	var buf [64]byte
	b := buf[:0]
	for i, v := range limits {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}

// shareCounts puts the ledger's counts (in the policy's order of the
// global windows) in the share part's order; nil when the ledger gave
// none for every window.
func (g *Ceiling) shareCounts(counts []int64) []int64 {
	if len(counts) != len(g.h.Windows) {
		return nil
	}
	out := make([]int64, 0, len(g.h.Order))
	for _, i := range g.h.Order {
		out = append(out, counts[i])
	}
	return out
}

// GlobalState is what a node knows of its data centre's standing with the
// ledger.
type GlobalState struct {
	Datacenter  string
	Static      bool
	Datacenters int64
	RoundTrip   time.Duration
}

// Failing reports whether the ledger's last call failed.
func (g *Ceiling) Failing() bool { return g.down.Load() }

// Datacenter is this node's data centre's name.
func (g *Ceiling) Datacenter() string { return g.cfg.Datacenter }

// Shares is each data centre's share of identity's ceiling, as the ledger
// sees it.
func (g *Ceiling) Shares(ctx context.Context, identity string) ([]LedgerShare, error) {
	return g.cfg.Ledger.Show(ctx, g.request(g.h.Tag(identity)))
}

// Unspent is what req's share here holds of its grants not used, as the
// ledger counts them (a grant in a slot at its units until it comes back,
// while a window holds it).
func (g *Ceiling) Unspent(ctx context.Context, req Request) (int64, error) {
	view, err := g.dc.ShareBegin(ctx, g.h.ShareKey(req.Identity), Sig(req.Limits), false)
	var n int64
	for _, gr := range view.Grants {
		if gr.Deadline > view.Now-g.wmax || gr.Deadline <= 1 {
			n += max(gr.Units-gr.Used, 0)
		}
	}
	return n, err
}

// State is what this node knows of its data centre's standing.
func (g *Ceiling) State() GlobalState {
	return GlobalState{Datacenter: g.cfg.Datacenter, Static: g.static.Load(), Datacenters: g.n.Load(),
		RoundTrip: time.Duration(g.rtt.Load()) * time.Microsecond}
}

// SetHook is a test hook (limiter's export_global_test.go): hook is called
// at each stage of a renewal, "granted" (the ledger granted, the share does
// not hold it yet) and "deposited" (the share was written), for the fault
// tests (a node killed there, a reload during a renewal). Not for
// production use.
func (g *Ceiling) SetHook(hook func(stage string)) { g.hook.Store(&hook) }

// Closing is a test hook (limiter's export_global_test.go): whether Close
// began (the renewals in flight still landing).
func (g *Ceiling) Closing() bool { return g.stopped() }

// PendingDrops is a test hook (limiter's export_global_test.go): the
// shares a reset asked to drop whose try failed, kept to be tried again.
func (g *Ceiling) PendingDrops() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, d := range g.drops {
		if d.err != nil {
			n++
		}
	}
	return n
}
