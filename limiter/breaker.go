package limiter

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ErrCircuitOpen is returned by a Breaker while its circuit is open: the
// store is not called, so the request costs no timeout.
var ErrCircuitOpen = errors.New("circuit open: store recently failing, not called")

// BreakerState is the state of a Breaker's circuit.
type BreakerState int32

// The circuit states.
const (
	// Closed: calls go to the store.
	Closed BreakerState = iota
	// Open: calls fail at once with ErrCircuitOpen until the cool-down ends.
	Open
	// HalfOpen: one probe call goes to the store; the others fail at once.
	HalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// BreakerConfig tunes a Breaker. Zero fields take the defaults.
type BreakerConfig struct {
	// Threshold is the number of consecutive failures that opens the
	// circuit. Default 5.
	Threshold int
	// MinCooldown is the first open period. Default 250ms.
	MinCooldown time.Duration
	// MaxCooldown caps the open period, which doubles after each failed
	// probe. Default 5s.
	MaxCooldown time.Duration
	// OnChange, if set, is called once per state change (never per
	// request), outside the breaker's lock.
	OnChange func(from, to BreakerState, cause error)
	// Now is the clock; default time.Now.
	Now func() time.Time
	// IsFailure tells which errors count against the store. Default: every
	// error. For Redis, IsUnavailable: an error reply about one key or one
	// script (NOPERM, WRONGTYPE) must not open a circuit that every limiter
	// on a healthy Redis shares.
	IsFailure func(error) bool
}

// Breaker is a circuit breaker around a Store. After Threshold consecutive
// failures it stops calling the store for a cool-down, then lets one probe
// through: success closes the circuit, failure opens it again for twice as
// long (up to MaxCooldown). "Over the limit" is a result, not a failure, and
// a caller that gives up (context canceled) does not count either.
type Breaker struct {
	store Store
	cfg   BreakerConfig

	state    atomic.Int32 // BreakerState
	failures atomic.Int32 // consecutive, while closed

	mu        sync.Mutex
	openUntil time.Time
	cooldown  time.Duration
	probing   bool

	held held // releases and records the store did not get
}

// NewBreaker wraps store.
func NewBreaker(store Store, cfg BreakerConfig) *Breaker {
	if cfg.Threshold <= 0 {
		cfg.Threshold = 5
	}
	if cfg.MinCooldown <= 0 {
		cfg.MinCooldown = 250 * time.Millisecond
	}
	if cfg.MaxCooldown < cfg.MinCooldown {
		cfg.MaxCooldown = max(5*time.Second, cfg.MinCooldown)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Breaker{store: store, cfg: cfg}
}

// State returns the circuit's state.
func (b *Breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// Store returns the wrapped store.
func (b *Breaker) Store() Store { return b.store }

// Do implements Store.
func (b *Breaker) Do(ctx context.Context, op *Op) (Reply, error) {
	probe := false
	if BreakerState(b.state.Load()) != Closed {
		ok, p, halfOpened := b.admit()
		if halfOpened {
			b.notify(Open, HalfOpen, nil)
		}
		if !ok {
			b.hold(op, true, nil, time.Time{})
			return Reply{}, ErrCircuitOpen
		}
		probe = p
	}
	if op.Lease != nil && op.Mode != ModeRelease && (b.held.n.Load() > 0 || b.held.sending.Load()) {
		b.releaseFirst(ctx, op)
	}
	res, err := b.store.Do(ctx, op)
	b.done(ctx, probe, err)
	if err != nil {
		b.hold(op, false, err, time.Time{})
	} else if b.held.n.Load() > 0 {
		b.deliver()
	}
	return res, err
}

// Reset implements Store; it is not guarded (an operator's reset should
// reach Redis or say why not).
func (b *Breaker) Reset(ctx context.Context, keys ...string) error {
	return b.store.Reset(ctx, keys...)
}

// done records the outcome of a call.
func (b *Breaker) done(ctx context.Context, probe bool, err error) {
	switch {
	case err == nil:
		if probe || b.failures.Load() != 0 {
			b.succeeded(probe)
		}
	case ctx.Err() == context.Canceled && !errors.Is(err, context.DeadlineExceeded),
		b.cfg.IsFailure != nil && !b.cfg.IsFailure(err):
		// The caller went away, or the store answered with an error about
		// this request: that says nothing about the store's health.
		if probe {
			b.endProbe()
		}
	default:
		b.failed(probe, err)
	}
}

// admit decides whether a call may go through an open or half-open
// circuit: at most one probe once the cool-down has passed.
func (b *Breaker) admit() (ok, probe, halfOpened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case Closed:
		return true, false, false
	case Open:
		if b.cfg.Now().Before(b.openUntil) {
			return false, false, false
		}
		b.state.Store(int32(HalfOpen))
		b.probing = true
		return true, true, true
	default: // HalfOpen
		if b.probing {
			return false, false, false
		}
		b.probing = true
		return true, true, false
	}
}

func (b *Breaker) succeeded(probe bool) {
	b.failures.Store(0)
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.cooldown = 0
	from := BreakerState(b.state.Swap(int32(Closed)))
	b.mu.Unlock()
	if from != Closed {
		b.notify(from, Closed, nil)
	}
}

func (b *Breaker) endProbe() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

func (b *Breaker) failed(probe bool, err error) {
	if !probe && b.failures.Add(1) < int32(b.cfg.Threshold) {
		return
	}
	b.mu.Lock()
	if !probe && BreakerState(b.state.Load()) != Closed {
		// Another call already opened the circuit.
		b.mu.Unlock()
		return
	}
	b.probing = false
	if b.cooldown == 0 {
		b.cooldown = b.cfg.MinCooldown
	} else if probe {
		b.cooldown = min(2*b.cooldown, b.cfg.MaxCooldown)
	}
	b.openUntil = b.cfg.Now().Add(b.cooldown)
	b.failures.Store(0)
	from := BreakerState(b.state.Swap(int32(Open)))
	b.mu.Unlock()
	if from != Open {
		b.notify(from, Open, err)
	}
}

func (b *Breaker) notify(from, to BreakerState, cause error) {
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(from, to, cause)
	}
}

// maxHeld bounds the releases and records a Breaker holds for its store.
const maxHeld = 4096

// held is what the store has still to get: the releases of leases and the
// count_only records of requests it decided, whose call after the response
// did not reach it (the circuit was open, or the store failed). They are
// sent once a call succeeds again (the probe that closes the circuit), in
// the background, each while it still means something: a release until its
// lease would have expired anyway (lease_timeout), a record within its
// shortest window. A release is sent again whatever the failure (releasing
// twice is harmless); a record only when it was never sent (a record that
// failed may have been counted).
//
// A check of a key whose releases are held sends them first (releaseFirst):
// a request is never refused for leases its node knows are given back.
type held struct {
	mu      sync.Mutex
	ops     []heldOp
	n       atomic.Int32
	sending atomic.Bool
	// inFlight is the lease key of the release deliver is sending ("" for
	// none), and sent closes when that send ends.
	inFlight string
	sent     chan struct{}
}

type heldOp struct {
	op    Op
	until time.Time
}

// hold keeps op for later when it is a release, or a record never sent
// (unsent; otherwise err is the store's, and an error about the op itself
// is no reason to send it again), until then (zero: as long as it is worth
// sending from now).
func (b *Breaker) hold(op *Op, unsent bool, err error, until time.Time) {
	if op.Mode != ModeRelease && (op.Mode != ModeRecord || !unsent) ||
		op.Mode == ModeRelease && op.Lease == nil ||
		!unsent && b.cfg.IsFailure != nil && !b.cfg.IsFailure(err) {
		return
	}
	if until.IsZero() {
		until = b.cfg.Now().Add(heldFor(op))
	}
	b.held.mu.Lock()
	defer b.held.mu.Unlock()
	if len(b.held.ops) >= maxHeld {
		// A long outage: drop what is no longer worth sending.
		now := b.cfg.Now()
		b.held.ops = slices.DeleteFunc(b.held.ops, func(h heldOp) bool { return !now.Before(h.until) })
	}
	if len(b.held.ops) >= maxHeld {
		return // the lease expires by itself; the units are lost
	}
	b.held.ops = append(b.held.ops, heldOp{op: *op, until: until})
	b.held.n.Store(int32(len(b.held.ops)))
}

// heldFor is how long a held op is worth sending.
func heldFor(op *Op) time.Duration {
	if op.Mode == ModeRelease {
		return time.Duration(op.Lease.Timeout) * time.Microsecond
	}
	var d time.Duration
	for _, p := range op.Parts {
		for _, w := range p.Windows {
			l := time.Duration(w.Len) * time.Microsecond
			if p.Kind == KindCalendar {
				l = time.Duration(w.Bounds[2]-w.Bounds[1]) * time.Microsecond
			}
			if d == 0 || l < d {
				d = l
			}
		}
	}
	return d
}

// deliver sends the held ops in the background, one sender at a time,
// each op taken out of held as it is sent (so that releaseFirst finds a
// release either still held or being sent).
func (b *Breaker) deliver() {
	if !b.held.sending.CompareAndSwap(false, true) {
		return
	}
	b.held.mu.Lock()
	n := len(b.held.ops) // those held now: one that fails again waits for the next delivery
	b.held.mu.Unlock()
	go func() {
		defer b.held.sending.Store(false)
		for range n {
			h, done, ok := b.nextHeld()
			if !ok {
				return
			}
			b.send(&h)
			b.held.mu.Lock()
			b.held.inFlight, b.held.sent = "", nil
			b.held.mu.Unlock()
			close(done)
		}
	}()
}

// nextHeld takes the first held op out, marking it in flight.
func (b *Breaker) nextHeld() (heldOp, chan struct{}, bool) {
	b.held.mu.Lock()
	defer b.held.mu.Unlock()
	if len(b.held.ops) == 0 {
		return heldOp{}, nil, false
	}
	h := b.held.ops[0]
	b.held.ops = b.held.ops[1:]
	b.held.n.Store(int32(len(b.held.ops)))
	done := make(chan struct{})
	if h.op.Mode == ModeRelease {
		b.held.inFlight, b.held.sent = h.op.Lease.Key, done
	}
	return h, done, true
}

// send sends a held op while it is still worth sending, holding it again
// when the store fails.
func (b *Breaker) send(h *heldOp) {
	if !b.cfg.Now().Before(h.until) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := b.store.Do(ctx, &h.op)
	cancel()
	if err != nil {
		b.hold(&h.op, false, err, h.until)
	}
}

// releaseFirst sends, before check (an Op with a lease), the releases of
// its lease key held (and waits for one deliver is sending, within ctx):
// the check must not count leases its node knows are given back. Each
// goes with the check's deadline, so that a release that meets a stalled
// Redis does not run when it resumes, later than the check it came
// before. A release the store fails is held again; the check goes on (its
// own call says whether the store answers).
func (b *Breaker) releaseFirst(ctx context.Context, check *Op) {
	key := check.Lease.Key
	b.held.mu.Lock()
	var mine []heldOp
	b.held.ops = slices.DeleteFunc(b.held.ops, func(h heldOp) bool {
		if h.op.Mode == ModeRelease && h.op.Lease.Key == key {
			mine = append(mine, h)
			return true
		}
		return false
	})
	b.held.n.Store(int32(len(b.held.ops)))
	var wait chan struct{}
	if b.held.inFlight == key {
		wait = b.held.sent
	}
	b.held.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
		}
	}
	for i := range mine {
		h := &mine[i]
		if !b.cfg.Now().Before(h.until) {
			continue
		}
		rel := h.op
		rel.Deadline = check.Deadline
		if _, err := b.store.Do(ctx, &rel); err != nil {
			b.hold(&h.op, false, err, h.until)
		}
	}
}
