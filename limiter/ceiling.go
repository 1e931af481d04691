package limiter

// The engine's side of a global ceiling kept in a ledger every data centre
// shares (global_redis): the data-centre code is package limiter/dc, which
// imports nothing of this package; the engine calls it through one
// interface, ceiling, and decide.go keeps the decision. The names below
// are dc's, kept here as aliases so that callers need one package.

import (
	"context"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter/dc"
)

// Global is a global ceiling kept in a ledger every data centre shares
// (global_redis): Backend.Global. See dc.Global.
type Global = dc.Global

// GlobalEvent is one thing the global ceiling did; GlobalEventKind what.
type (
	GlobalEvent     = dc.GlobalEvent
	GlobalEventKind = dc.GlobalEventKind
)

// The events (dc's).
const (
	EventGrant       = dc.EventGrant
	EventLedgerError = dc.EventLedgerError
	EventReturn      = dc.EventReturn
	EventRenewal     = dc.EventRenewal
	EventStarved     = dc.EventStarved
	EventFailOpen    = dc.EventFailOpen
	EventStatic      = dc.EventStatic
	EventNormal      = dc.EventNormal
	EventBeat        = dc.EventBeat
	EventWait        = dc.EventWait
	EventDropped     = dc.EventDropped
)

// The ledger's client and its calls (dc's).
type (
	Ledger        = dc.Ledger
	LedgerWindow  = dc.LedgerWindow
	LedgerReturn  = dc.LedgerReturn
	LedgerRequest = dc.LedgerRequest
	LedgerReply   = dc.LedgerReply
	LedgerShare   = dc.LedgerShare
	// GlobalState is what a node knows of its data centre's standing with
	// the ledger.
	GlobalState = dc.GlobalState
)

// A data centre's share of a ceiling, as the stores keep it (dc's; the
// stores' side is share.go).
type (
	ShareStore = dc.ShareStore
	ShareGrant = dc.ShareGrant
	ShareView  = dc.ShareView
	Standing   = dc.Standing
	Deposit    = dc.Deposit
)

// The ledger's errors (dc's).
var (
	// ErrLedgerNotDurable: the ledger's replicas did not all acknowledge a
	// grant within the deadline; it is not used (the ledger still counts it).
	ErrLedgerNotDurable = dc.ErrLedgerNotDurable
	// ErrResetNotDurable: a reset carried out on the ledger's primary that
	// its replicas did not all acknowledge (a failover may lose it).
	ErrResetNotDurable = dc.ErrResetNotDurable
	// ErrLedgerUnreachable: a call of the ledger failed, and this node
	// waits for it to answer a probe before it asks again.
	ErrLedgerUnreachable = dc.ErrLedgerUnreachable
	// ErrNoShareStore: the backend's store cannot keep shares of a global
	// ceiling.
	ErrNoShareStore = dc.ErrNoShareStore

	// errStatic: the data centre is on its static share; errLedgerSlow: a
	// renewal the request waited for is slower than its lead, while the
	// ledger answers (a refusal, not the fail mode).
	errStatic, errLedgerSlow = dc.ErrStatic, dc.ErrLedgerSlow
)

// NewLedger returns a ledger over client: a Redis, Sentinel or Cluster
// client (dc.NewLedger).
func NewLedger(client Scripter) *Ledger { return dc.NewLedger(client) }

// ceiling is the engine's one way into the data-centre code (a ceiling
// kept in a ledger, global_redis): decide.go and globalview.go call these
// and nothing else of it; *dc.Ceiling is the one implementation.
type ceiling interface {
	Close()
	// UsesStatic, StaticNone, StaticLimit: the static share (fail local).
	UsesStatic() bool
	StaticNone(limits []int64) bool
	StaticLimit(limit int64) int64
	// Lead and Claim are a share part's (Part.Lead, Part.Claim).
	Lead() int64
	Claim() int64
	// Failing: the ledger's last call failed.
	Failing() bool
	Fetch(ctx context.Context, req dc.Request, key string, cost int64) error
	Await(ctx context.Context, req dc.Request, key string, cost int64) error
	Later(req dc.Request)
	Event(ev GlobalEvent)
	// For what operators are shown: the ledger's shares of an identity,
	// what this data centre's share holds unspent, its name, its standing.
	Shares(ctx context.Context, identity string) ([]LedgerShare, error)
	Unspent(ctx context.Context, req dc.Request) (int64, error)
	Datacenter() string
	State() GlobalState
	// Reset: an operator's reset of an identity in the ledger, and the
	// other data centres' shares of it dropped.
	Reset(ctx context.Context, identity string) (int64, error)
}

var _ ceiling = (*dc.Ceiling)(nil)

// newGlobal starts the data-centre code for a limiter (dc.New; h:
// Limiter.host); its errors are the policy's.
func newGlobal(h dc.Host, cfg Global) (ceiling, error) {
	g, err := dc.New(h, cfg)
	if err != nil {
		return nil, &PolicyError{Field: "global_redis", Err: err}
	}
	return g, nil
}

// host is what the data-centre code needs of the limiter: its policy's
// global windows as the ledger counts them and where they are in a Reply's
// Limits, the share part's windows, its keys, its own store, its deny
// cache.
func (l *Limiter) host() dc.Host {
	ss, _ := l.b.Base.(ShareStore) // nil: it keeps no shares (dc.New refuses)
	h := dc.Host{Namespace: l.keys.Namespace(), FailLocal: l.p.Fail == FailLocal, Now: l.p.Now,
		CountOnly: l.p.CountOnly != nil, Store: ss, Tag: Tag,
		ShareKey: func(identity string) string { return l.keys.Global("share", identity) },
		Forget: func(tag string) {
			if l.cache != nil { // built after the global: read at each renewal
				l.cache.Forget(tag)
			}
		},
		Unavailable: IsUnavailable,
		Drop: func(ctx context.Context, tag, key string) error {
			if err := l.b.Base.Reset(ctx, key); err != nil {
				return err
			}
			l.forgetDenials(ctx, tag) // and the data centre's other nodes, as a reset's notice
			return nil
		}}
	nb, loc := len(l.p.Windows), l.p.Location
	for i, w := range l.p.GlobalWindows {
		dw := dc.Window{Name: l.wnames[nb+i], Len: w.Duration, Longest: w.Duration}
		if p := w.Period; p != PeriodNone {
			dw = dc.Window{Name: p.String(), Longest: p.Longest(), Bounds: func(now time.Time) [4]int64 { return p.Bounds(now, loc) }}
		}
		h.Windows, h.Pos = append(h.Windows, dw), append(h.Pos, l.layout[nb+i])
	}
	for _, ps := range l.parts {
		if ps.kind == KindShare {
			for _, i := range ps.windows {
				h.Order = append(h.Order, i-nb)
			}
		}
	}
	return h
}

// dcRequest is in, as the data-centre code takes it, with the limits the
// store applied (r's, when an override changed one; r may be nil).
func dcRequest(in *Input, r *Reply) dc.Request {
	req := dc.Request{Identity: in.Identity, Cost: in.Cost, Limits: in.GlobalLimits}
	if r != nil {
		req.Applied, req.Renew = r.Limits, r.Share&ShareRenew != 0
	}
	return req
}

// shareSig is the signature of in's global limits (dc.Sig): grants made
// under other limits (before a reload, another placeholder value) are not
// used under these.
func shareSig(in *Input) string { return dc.Sig(in.GlobalLimits) }
