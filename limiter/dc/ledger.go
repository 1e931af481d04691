package dc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter/internal/rediskit"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// Ledger is the client of the ledger every data centre shares
// (global_redis): lua/ledger.lua grants shares of identities' global
// ceilings, takes them back and keeps the data centres' membership. Safe
// for concurrent use; one Ledger serves every limiter of a process.
type Ledger struct {
	client Client
	clock  rediskit.Offset

	mu       sync.Mutex
	replicas int64 // connected replicas in the last reply: a grant waits for them
	seen     map[string]string
}

// NewLedger returns a ledger over client: a Redis, Sentinel or Cluster
// client. Every key of the ledger has one hash tag, {ledger}: on a Cluster
// it lives on one slot (the membership, the epoch and every identity's
// grants are read in one script), so one shard serves it.
func NewLedger(client Client) *Ledger {
	return &Ledger{client: client, seen: map[string]string{}}
}

// Client is what the ledger needs of a go-redis client (every one has it:
// limiter.Scripter is more): scripts and pipelines (a grant and its WAIT on
// one connection). The ledger's clock is read with TIME where the client
// has it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Every go-redis client is a Client.
var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (redis.UniversalClient)(nil)
)

var ledgerScript = redis.NewScript(lua.Ledger)

// LedgerWindow is one window of a global ceiling, as the ledger counts it.
type LedgerWindow struct {
	Name  string
	Len   int64 // µs; for a calendar period, 0 and Bounds
	Limit int64
	// Bounds are, for a calendar period, three periods in a row around the
	// caller's clock (Period.Bounds).
	Bounds   [4]int64
	Calendar bool
}

// LedgerReturn is a grant given back: the units used and their last use,
// µs after the grant's start (0: unused).
type LedgerReturn struct {
	ID         string
	Used, Last int64
}

// LedgerRequest is one call of the ledger.
type LedgerRequest struct {
	// Namespace is the limiter's key namespace; Tag the identity's hash tag
	// (grant and show).
	Namespace, Tag string
	DC             string
	// Deadline: the call does not run after it (on the ledger's clock).
	Deadline time.Time
	// QWait, Skew, Beat, WMax, Tail, Heard: see lua/ledger.lua (µs).
	QWait, Skew, Beat, WMax, Tail, Heard int64
	// Static: this data centre goes to a static share when cut off;
	// WasStatic: it was in static mode.
	Static, WasStatic bool
	// Grant: units wanted, the grant's length (µs), the demand (units per
	// second), the fewest units worth granting (a request's cost less what
	// the share holds), the grants returned and the ceiling's windows.
	Want, Length, Rate, Least int64
	Returns                   []LedgerReturn
	Windows                   []LedgerWindow
	// Used: the units used so far of the grants not ended (ID, Used), for
	// what the ledger shows as admitted.
	Used []LedgerReturn
	// Ticket is what this data centre's nodes need to renew the share: the
	// ledger keeps it and hands it back in a recall (Recalls).
	Ticket string
}

// LedgerReply is the ledger's answer.
type LedgerReply struct {
	// Waiting: the ledger grants nothing until Retry passes (a new epoch,
	// a failover).
	Waiting bool
	Now     int64
	// Units granted (0: no room, or not asked) for Length µs, with ID;
	// Retry µs until there may be room when fewer than wanted.
	Units, Length, Retry int64
	ID                   string
	// N is the data centres the ledger knows; Replicas the ledger's.
	N, Replicas int64
	Epoch       string
	// Counts are the units counted in each window after the grant.
	Counts []int64
}

// ErrLedgerNotDurable: the ledger's replicas did not all acknowledge a
// grant within the deadline; it is not used (the ledger still counts it).
var ErrLedgerNotDurable = errors.New("limiter: a grant the ledger's replicas did not acknowledge")

// ErrResetNotDurable: an operator's reset was carried out on the ledger's
// primary (and the data centres told), but its replicas did not all
// acknowledge it within the deadline: a failover now may lose it.
var ErrResetNotDurable = errors.New("limiter: a reset the ledger's replicas did not acknowledge")

func (lg *Ledger) keys(req *LedgerRequest, op string) []string {
	k := []string{req.Namespace + "{ledger}:members", req.Namespace + "{ledger}:epoch"}
	if op == "recalls" {
		return append(k, req.Namespace+"{ledger}:recall:"+req.DC)
	}
	if op != "beat" {
		k = append(k, req.Namespace+"{ledger}:g:"+req.Tag, req.Namespace+"{ledger}:h:"+req.Tag)
	}
	return k
}

// node is the client for a call: on a Cluster, the master of the ledger's
// slot (a WAIT must reach the server that took the write).
func (lg *Ledger) node(ctx context.Context, namespace string) (Client, error) {
	if cc, ok := lg.client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, namespace+"{ledger}:members")
	}
	return lg.client, nil
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (lg *Ledger) args(req *LedgerRequest, op string) []any {
	lg.mu.Lock()
	seen := lg.seen[req.Namespace]
	lg.mu.Unlock()
	deadline := int64(0)
	if !req.Deadline.IsZero() {
		deadline = max(lg.clock.Deadline(req.Deadline), 0)
	}
	a := []any{op, req.DC, deadline, seen, req.QWait, req.Skew, req.Beat, b01(req.Static), b01(req.WasStatic), req.WMax, req.Tail, req.Heard}
	if op != "grant" {
		return a
	}
	a = append(a, req.Want, req.Length, req.Rate, req.Least, req.Ticket, len(req.Returns))
	for _, r := range req.Returns {
		a = append(a, r.ID, r.Used, r.Last)
	}
	a = append(a, len(req.Windows))
	for _, w := range req.Windows {
		if w.Calendar {
			a = append(a, w.Name, 1, 0, w.Limit, w.Bounds[0], w.Bounds[1], w.Bounds[2], w.Bounds[3])
		} else {
			a = append(a, w.Name, 0, w.Len, w.Limit, 0, 0, 0, 0)
		}
	}
	a = append(a, len(req.Used))
	for _, u := range req.Used {
		a = append(a, u.ID, u.Used)
	}
	return a
}

// learn reads the ledger's clock once, so that every call carries a
// deadline on it.
func (lg *Ledger) learn(ctx context.Context) error {
	if lg.clock.Known() {
		return nil
	}
	tc, ok := lg.client.(interface {
		Time(ctx context.Context) *redis.TimeCmd
	})
	if !ok {
		return errors.New("limiter: the ledger's client cannot read TIME")
	}
	sent := time.Now()
	t, err := tc.Time(ctx).Result()
	if err != nil {
		return err
	}
	lg.clock.Sample(t.UnixMicro(), sent)
	return nil
}

// Do runs op ("grant" or "beat") for req.
func (lg *Ledger) Do(ctx context.Context, op string, req *LedgerRequest) (LedgerReply, error) {
	if err := lg.learn(ctx); err != nil {
		return LedgerReply{}, err
	}
	keys, args := lg.keys(req, op), lg.args(req, op)
	lg.mu.Lock()
	wait := lg.replicas
	lg.mu.Unlock()
	sent := time.Now()
	node, err := lg.node(ctx, req.Namespace)
	if err != nil {
		return LedgerReply{}, err
	}
	raw, waited, err := lg.run(ctx, node, keys, args, op == "grant" && wait > 0, wait, req.Deadline)
	if err != nil {
		return LedgerReply{}, err
	}
	r, err := parseLedger(raw)
	if err != nil {
		return LedgerReply{}, err
	}
	lg.clock.Sample(r.Now, sent)
	lg.mu.Lock()
	lg.replicas = r.Replicas
	if r.Epoch != "" {
		lg.seen[req.Namespace] = r.Epoch
	}
	lg.mu.Unlock()
	if r.Units > 0 && waited < r.Replicas {
		return r, fmt.Errorf("%w: %d of %d replicas", ErrLedgerNotDurable, waited, r.Replicas)
	}
	return r, nil
}

// run sends the script, and WAIT for the replicas when asked to, on one
// connection.
func (lg *Ledger) run(ctx context.Context, node Client, keys []string, args []any, wait bool, replicas int64, deadline time.Time) ([]any, int64, error) {
	if !wait {
		raw, err := eval(ctx, node, keys, args)
		return raw, 0, err
	}
	// WAIT gives up at a quarter of the time left, so that its reply (how many
	// replicas have the grant, and how many there are now: a failover
	// changes both) comes back within the deadline.
	ms := int64(100)
	if !deadline.IsZero() {
		ms = max(time.Until(deadline).Milliseconds()/4, 1)
	}
	p := node.Pipeline()
	cmd := ledgerScript.EvalSha(ctx, p, keys, args...)
	w := p.Do(ctx, "WAIT", replicas, ms)
	_, _ = p.Exec(ctx)
	raw, err := cmd.Slice()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		// A server without the script (restarted, or a replica promoted):
		// load it, and wait for nothing this time (a grant then is not
		// known durable, and not used); the reply says how many replicas
		// there are now.
		raw, err = ledgerScript.Eval(ctx, node, keys, args...).Slice()
		return raw, 0, err
	}
	if err != nil {
		return nil, 0, err
	}
	n, err := w.Int64()
	if err != nil {
		return raw, 0, nil // the grant stands in the ledger; not known durable
	}
	return raw, n, nil
}

// eval runs the script by its SHA, and by its text when the server does
// not have it (which loads it): one round trip, two the first time.
func eval(ctx context.Context, c Client, keys []string, args []any) ([]any, error) {
	raw, err := ledgerScript.EvalSha(ctx, c, keys, args...).Slice()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		raw, err = ledgerScript.Eval(ctx, c, keys, args...).Slice()
	}
	return raw, err
}

func parseLedger(raw []any) (LedgerReply, error) {
	if len(raw) < 2 {
		return LedgerReply{}, fmt.Errorf("%w: ledger reply of %d values", rediskit.ErrBadReply, len(raw))
	}
	n := func(i int) int64 {
		if i >= len(raw) {
			return 0
		}
		v, _ := raw[i].(int64)
		return v
	}
	s := func(i int) string {
		if i >= len(raw) {
			return ""
		}
		v, _ := raw[i].(string)
		return v
	}
	switch n(0) {
	case 3:
		return LedgerReply{}, rediskit.ErrLate
	case 0, 1:
	default:
		return LedgerReply{}, fmt.Errorf("%w: ledger status %d", rediskit.ErrBadReply, n(0))
	}
	if len(raw) < 8 {
		return LedgerReply{}, fmt.Errorf("%w: ledger reply of %d values", rediskit.ErrBadReply, len(raw))
	}
	r := LedgerReply{Waiting: n(0) == 0, Now: n(1), Units: n(2), Length: n(3), Retry: n(4), N: n(5), Replicas: n(6), Epoch: s(7), ID: s(8)}
	for i := 9; i < len(raw); i++ {
		r.Counts = append(r.Counts, n(i))
	}
	if r.Units < 0 || r.Retry < 0 || r.Length < 0 || r.Units > 0 && (r.ID == "" || r.Length == 0) {
		return LedgerReply{}, fmt.Errorf("%w: ledger grant %+v", rediskit.ErrBadReply, r)
	}
	return r, nil
}

// LedgerShare is one data centre's part of an identity's ceiling, as the
// ledger sees it.
type LedgerShare struct {
	Datacenter string
	// Held: units granted and not ended; Counted: units counted in the
	// longest window; Rate: the demand it last reported (per second);
	// Admitted: the units of those grants it used, as it last told the
	// ledger (at its renewals).
	Held, Counted, Rate, Admitted int64
}

// Ping asks the ledger for its clock, which changes nothing there: a
// probe of whether it answers.
func (lg *Ledger) Ping(ctx context.Context) error {
	lg.clock.Forget()
	return lg.learn(ctx)
}

// Recalls returns the tickets of the identities whose unspent grants the
// ledger asks req.DC to give back (another data centre was refused for want
// of room), each once. It changes nothing else there: no membership.
func (lg *Ledger) Recalls(ctx context.Context, req *LedgerRequest) ([]string, error) {
	raw, err := eval(ctx, lg.client, lg.keys(req, "recalls"), lg.args(req, "recalls"))
	if err != nil {
		return nil, err
	}
	if len(raw) < 2 {
		return nil, fmt.Errorf("%w: recalls of %d values", rediskit.ErrBadReply, len(raw))
	}
	if st, _ := raw[0].(int64); st == 3 {
		return nil, rediskit.ErrLate
	}
	out := make([]string, 0, len(raw)-2)
	for _, v := range raw[2:] {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// Show returns each data centre's share of an identity's ceiling.
func (lg *Ledger) Show(ctx context.Context, req *LedgerRequest) ([]LedgerShare, error) {
	raw, err := eval(ctx, lg.client, lg.keys(req, "show"), lg.args(req, "show"))
	if err != nil {
		return nil, err
	}
	var out []LedgerShare
	for i := 1; i+4 < len(raw); i += 5 {
		name, _ := raw[i].(string)
		h, _ := raw[i+1].(int64)
		c, _ := raw[i+2].(int64)
		r, _ := raw[i+3].(int64)
		u, _ := raw[i+4].(int64)
		out = append(out, LedgerShare{Datacenter: name, Held: h, Counted: c, Rate: r, Admitted: u})
	}
	return out, nil
}

// Reset forgets the grants of an identity (req.Tag; an operator's reset
// through a node of req.DC), and recalls the share of every other data
// centre that held one, marked as a reset's (ticket.Reset): its nodes drop
// it (Recalls). It returns how many data centres were told.
//
// With replicas (as the ledger's last reply counted them), the reset waits
// for them as a grant does: one they did not all acknowledge stands on the
// primary and returns the data centres told with ErrResetNotDurable.
func (lg *Ledger) Reset(ctx context.Context, req *LedgerRequest) (int64, error) {
	lg.mu.Lock()
	wait := lg.replicas
	lg.mu.Unlock()
	node, err := lg.node(ctx, req.Namespace)
	if err != nil {
		return 0, err
	}
	raw, waited, err := lg.run(ctx, node, lg.keys(req, "reset"), lg.args(req, "reset"), wait > 0, wait, req.Deadline)
	if err != nil {
		return 0, err
	}
	if st, _ := raw[0].(int64); st == 3 {
		return 0, rediskit.ErrLate
	} else if st != 5 || len(raw) < 3 {
		return 0, fmt.Errorf("%w: reset reply %v", rediskit.ErrBadReply, raw)
	}
	n, _ := raw[2].(int64)
	if waited < wait {
		return n, fmt.Errorf("%w: %d of %d replicas", ErrResetNotDurable, waited, wait)
	}
	return n, nil
}
