package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// script is decide.lua with the algorithms spliced in; logScript the same
// with sliding_log's alone, for EVALSHA calls of log checks without a ban
// (lua.DecideLog).
var (
	script    = redis.NewScript(lua.Decide)
	logScript = redis.NewScript(lua.DecideLog)
)

// Scripter is what the Redis store needs of a go-redis client: scripts,
// commands it builds itself and pipelines (for batches), DEL (for resets)
// and pub/sub (for telling other processes about resets). Every go-redis
// client has them.
type Scripter interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Every go-redis client is a Scripter.
var (
	_ Scripter = (*redis.Client)(nil)
	_ Scripter = (*redis.ClusterClient)(nil)
	_ Scripter = (redis.UniversalClient)(nil)
)

// RedisStore decides Ops with one call of decide.lua each, or, batched, one
// call for the concurrent checks of one hash slot: FCALL of the script
// loaded as a function library where Redis has functions (7 and later,
// Valkey; the library is loaded again when Redis answers "function not
// found", as after a restart), EVALSHA elsewhere (and EVAL when Redis
// answers NOSCRIPT). It works with a single
// Redis, a Sentinel-managed one or a Redis Cluster: all keys of an Op share
// a hash tag. The client belongs to the caller; the store never closes it.
type RedisStore struct {
	client  Scripter
	cluster bool
	batch   *batcher // nil: one round trip per call
	clock   offsetClock
	notify  notifier
	scripts scripts // how decide.lua is called: FCALL or EVALSHA
	format  int     // the state format sliding_log and sliding_counter keys are written in (LogFormat)
}

// The state formats of a sliding_log key (lua/sliding_log.lua) and of a
// sliding_counter key (lua/sliding_counter.lua): LogFormat1 is the previous
// releases', LogFormat2 the first with a format version, LogFormat3 the
// log's cheapest (and, as CounterFormat3, the counter's endpoints in 20
// buckets). A store reads every one and writes one, turning a key of another
// format into it as it writes.
const (
	LogFormat1 = 1
	LogFormat2 = 2
	LogFormat3 = 3
)

// WithStateFormat sets the format the store writes sliding_log and
// sliding_counter keys in (each one's newest unless set): LogFormat1 while
// nodes of a release before the state format version share the Redis (a
// rolling upgrade from one, or a rollback to one: docs/redis.md,
// "Upgrading"); LogFormat2, each one's format 2 (for nodes of a build that
// writes it); LogFormat3 (= CounterFormat3), the log's and the counter's
// format 3 (for nodes of a build before format 4); CounterFormat4, the
// log's format 3 and the counter's format 4, each one's newest.
func WithStateFormat(f int) RedisOption {
	return func(s *RedisStore) {
		if f == LogFormat1 || f == LogFormat2 || f == LogFormat3 || f == CounterFormat4 {
			s.format = f
		}
	}
}

// CounterFormat3 is sliding_counter's state format 3 (lua/sliding_counter.lua:
// 20 buckets a window, each with its first and last arrival, a JSON array);
// CounterFormat4 the same buckets in fixed-width slots read and written in
// place, written unless WithStateFormat names an older one (the log is in
// its format 3 under both). The store reads formats 1 to 4.
const (
	CounterFormat3 = 3
	CounterFormat4 = 4
)

// counterKind is the kind decide.lua is given for a sliding_counter part
// written in format: 8 (format 1), 10 (format 2), 12 (format 3) or 2
// (format 4).
func counterKind(format int) int64 {
	switch format {
	case LogFormat1:
		return 8
	case LogFormat2:
		return 10
	case CounterFormat3:
		return 12
	}
	return int64(KindCounter)
}

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore)

// WithBatching sends the checks of concurrent requests together: one script
// call per hash slot decides a batch of checks in order, each still atomic
// over its own keys, on workers concurrent pipelines of at most maxBatch
// checks. Batching trades a wait of at most one batch for far fewer round
// trips, system calls and script calls.
func WithBatching(workers, maxBatch int) RedisOption {
	return func(s *RedisStore) {
		if workers > 0 && maxBatch > 1 {
			s.batch = newBatcher(s, workers, maxBatch)
		}
	}
}

// NewRedisStore returns a store that runs its script on client. Close it
// when done.
func NewRedisStore(client Scripter, opts ...RedisOption) *RedisStore {
	s := &RedisStore{client: client}
	s.scripts.turn = make(chan struct{}, 1)
	_, s.cluster = client.(*redis.ClusterClient)
	if u, ok := client.(redis.UniversalClient); ok {
		if _, c := u.(*redis.ClusterClient); c {
			s.cluster = true
		}
	}
	s.notify.store = s
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close stops the batching workers and the reset subscription. It does not
// close the client.
func (s *RedisStore) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	s.notify.close()
	return nil
}

// Reset implements Store. The keys must share a hash tag on a cluster.
func (s *RedisStore) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	return s.client.Del(ctx, keys...).Err()
}

// Do implements Store. The call gives up at op.Deadline, when set, as at
// ctx's deadline.
func (s *RedisStore) Do(ctx context.Context, op *Op) (Reply, error) {
	if err := op.validate(); err != nil {
		return Reply{}, err
	}
	deadline := s.clock.deadline(op.Deadline)
	if deadline < 0 {
		// No check goes without its deadline on Redis's clock: a check
		// that reached a stalled Redis would run when it resumes, though
		// its caller gave up and applied the fail mode.
		if err := s.learnClock(ctx, op.Deadline); err != nil {
			return Reply{}, err
		}
		deadline = s.clock.deadline(op.Deadline)
	}
	sent := time.Now()
	if s.batch != nil {
		return s.batch.do(ctx, op, deadline, sent)
	}
	if !op.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, op.Deadline)
		defer cancel()
	}
	var c check
	c.encode(op, deadline, s.format)
	cmd, name, loads := s.head(ctx, c.peek, c.log, c.fast)
	args := make([]any, 0, 6+len(c.keys)+len(c.args))
	args = append(args, cmd, name, len(c.keys))
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	var b bases
	b.add(&c)
	c.relative(&b)
	args = append(args, 1, c.int(b.deadlineBase()), c.int(b.nowBase()))
	args = append(args, c.args...)
	out, err := s.call(ctx, args, loads)
	var buf [16]int64
	var vals []int64
	var t int64
	if err == nil {
		vals, t, err = only(out, buf[:0])
	}
	if err != nil {
		return Reply{}, err
	}
	return s.reply(vals, t, op, sent)
}

// only appends the values of the single check of a one-check call's reply,
// as go-redis parsed it, to vals, and returns the call's reading of Redis
// TIME (0: none).
func only(out any, vals []int64) ([]int64, int64, error) {
	l, ok := out.([]any)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %T for 1 check", ErrBadReply, out)
	}
	vals, err, next, bad := valuesOf(l[:max(len(l)-1, 0)], 0, vals)
	var t int64
	if bad == nil {
		t, bad = callTime(l, next, 1)
	}
	if bad != nil {
		return nil, 0, bad
	}
	return vals, t, err
}

// callTime is the call's reading of Redis TIME, the last element of a
// call's reply as go-redis parsed it (decide.lua's header), which must be
// l[next], next being where the checks' replies (of n checks) end.
func callTime(l []any, next, n int) (int64, error) {
	if next != len(l)-1 {
		return 0, fmt.Errorf("%w: %d elements for %d checks and the time, %d left", ErrBadReply, len(l), n, len(l)-next)
	}
	t, ok := l[next].(int64)
	if !ok || t < 0 {
		return 0, fmt.Errorf("%w: the call's time is %T", ErrBadReply, l[next])
	}
	return t, nil
}

// valuesOf appends the values of the check whose reply starts at l[i] in a
// call's reply, as go-redis parsed it (an array of its values; or, the flat
// form a fast path writes, decide.lua's OUT, its values, the first 8 ×
// their number + the status: flatHead; or its error), to vals: an error reply is the check's error,
// and next is where the next check's starts; any other value is a
// malformed reply for that check alone. bad is for a reply that cannot be
// read on from there (a count past its end): the whole call's error.
func valuesOf(l []any, i int, vals []int64) (_ []int64, err error, next int, bad error) {
	if i >= len(l) {
		return nil, nil, i, fmt.Errorf("%w: %d values, none for a check at %d", ErrBadReply, len(l), i)
	}
	switch x := l[i].(type) {
	case error:
		return nil, x, i + 1, nil
	case []any:
		for j, y := range x {
			n, ok := y.(int64)
			if !ok {
				return nil, fmt.Errorf("%w: value %d is %T", ErrBadReply, j, y), i + 1, nil
			}
			vals = append(vals, n)
		}
		return vals, nil, i + 1, nil
	case int64:
		n, status, err := flatHead(x)
		if err != nil || n > int64(len(l)-i) {
			return nil, nil, i, fmt.Errorf("%w: a flat reply's first value %d (8 × its values + its status) at %d of %d", ErrBadReply, x, i, len(l))
		}
		vals = append(vals, status)
		end := i + int(n)
		for j, y := range l[i+1 : end] {
			n, ok := y.(int64)
			if !ok {
				return nil, fmt.Errorf("%w: value %d is %T", ErrBadReply, j+1, y), end, nil
			}
			vals = append(vals, n)
		}
		return vals, nil, end, nil
	}
	return nil, fmt.Errorf("%w: %T", ErrBadReply, l[i]), i + 1, nil
}

// reply reads one check's reply values, checked for shape before they are
// used, with its call's reading of Redis TIME, t (0: none; decide.lua's
// header): the check's now is op's, or t when op sent 0.
func (s *RedisStore) reply(n []int64, t int64, op *Op, sent time.Time) (Reply, error) {
	if len(n) < 1 {
		return Reply{}, fmt.Errorf("%w: %d values", ErrBadReply, len(n))
	}
	if t > 0 {
		// Read in a call sent after this check was: at least the offset.
		s.clock.sample(t, sent)
	}
	r := Reply{Status: Status(n[0]), Now: op.Now}
	if r.Now == 0 {
		r.Now = t
	}
	switch r.Status {
	case StatusLate:
		return Reply{}, ErrLate
	case StatusAllowed, StatusDenied, StatusBanned, StatusTooLarge:
	default:
		return Reply{}, fmt.Errorf("%w: status %d", ErrBadReply, n[0])
	}
	if op.Mode == ModeRelease {
		r.InFlight = -1
		return r, nil
	}
	nw := op.windows()
	if len(n) == 1+3*nw {
		// The short form (decide.lua's header): no ban, no lease, no flag.
		// (1+3*nw is never 5+3*nw nor 5+5*nw.)
		r.InFlight = -1
		return s.usage(r, n[1:], op, nw)
	}
	switch len(n) {
	case 5 + 3*nw:
	case 5 + 5*nw:
		// An override changed a limit: the windows' limits and bursts.
		r.Limits, r.Bursts = make([]int64, nw), make([]int64, nw)
		for j := range nw {
			r.Limits[j], r.Bursts[j] = n[5+3*nw+2*j], n[6+3*nw+2*j]
			if r.Limits[j] <= 0 || r.Bursts[j] < 0 {
				return Reply{}, fmt.Errorf("%w: limit %d, burst %d", ErrBadReply, r.Limits[j], r.Bursts[j])
			}
		}
	default:
		return Reply{}, fmt.Errorf("%w: %d values for %d windows", ErrBadReply, len(n), nw)
	}
	r.BanLeft, r.BanStarted, r.InFlight, r.LeaseDenied = n[1], n[2] == 1, n[3], n[4]&1 == 1
	r.Share = ShareFlags(n[4] &^ 1)
	return s.usage(r, n[5:], op, nw)
}

// usage reads the windows' count, retry and reset (n, from the first
// window's count) into r and checks r whole.
func (s *RedisStore) usage(r Reply, n []int64, op *Op, nw int) (Reply, error) {
	if r.Status == StatusTooLarge && r.Limits == nil {
		return Reply{}, fmt.Errorf("%w: too large with no override", ErrBadReply)
	}
	r.Usage = op.usageFor(nw)[:nw]
	denied := false
	for j := range r.Usage {
		u := Usage{Count: n[3*j], Retry: n[1+3*j], Reset: n[2+3*j]}
		if u.Count < 0 || u.Retry < 0 || u.Reset < 0 {
			return Reply{}, fmt.Errorf("%w: negative usage %+v", ErrBadReply, u)
		}
		denied = denied || u.Retry > 0
		r.Usage[j] = u
	}
	if r.Status == StatusDenied && !denied && !r.LeaseDenied {
		return Reply{}, fmt.Errorf("%w: denied with no retry time", ErrBadReply)
	}
	if r.Status == StatusBanned && r.BanLeft <= 0 {
		return Reply{}, fmt.Errorf("%w: banned with no ban time", ErrBadReply)
	}
	return r, nil
}

// check is one Op encoded for the script: its KEYS and its ARGV (from its
// shape on).
//
// Encoding boxes nothing: a value goes into args as an int below 256 (Go
// boxes those without allocating) or as a pointer to its copy in ints or
// strs (go-redis writes *int64 and *string as their values), and keys stay
// in keys, whose elements a batch passes by pointer too. So the check owns
// the storage its args point into, sized before the first pointer is taken
// so that no append moves it; a batched check lives in a pooled batchOp and
// keeps its slices from one request to the next.
type check struct {
	keys []string
	args []any
	ints []int64
	strs []string
	// sb is the shape being built (decide.lua's header), shape the string
	// of the last one built, kept while the next is the same (the same
	// limiter, mode and cost: no allocation).
	sb    []byte
	shape string
	// now and deadline are the check's (op.Now; the deadline on Redis's
	// clock: 0 none, -1 none but read TIME); args holds them relative to
	// their call's bases (relative). wholeNow: its now goes whole (bases).
	now, deadline int64
	wholeNow      bool
	peek          bool // the Op only peeks: it writes nothing
	log           bool // the Op's parts are all sliding_log's, with no ban: lua.DecideLog decides it
	fast          Kind // the Op is of the form lua.DecideFast's script of this kind takes (0: none)
}

// encode encodes op, with the deadline on Redis's clock, its sliding_log
// and sliding_counter parts to be written in format (LogFormat1: kinds 7
// and 8; LogFormat2: kinds 1 and 10; LogFormat3: kinds 11 and 12; else
// (CounterFormat4), the log as kind 11 and the counter as kind 2): the
// values a limiter repeats in one
// string, its shape (decide.lua's header), and the ones that change as
// arguments of their own.
func (c *check) encode(op *Op, deadline int64, format int) {
	nk, nargs := len(op.Parts), 3
	for i := range op.Parts {
		switch op.Parts[i].Kind {
		case KindShare:
			nargs += 3
		case KindCalendar:
			nargs += 4 * len(op.Parts[i].Windows)
		}
	}
	if op.Ban != nil {
		nk++
	}
	if op.Lease != nil {
		nk, nargs = nk+1, nargs+1
	}
	if op.Override != nil {
		nk, nargs = nk+1, nargs+1
	}
	c.keys = resize(c.keys, nk)
	c.args = resize(c.args, nargs)
	c.ints = resize(c.ints, nargs+3) // and a call's bases (Do)
	c.strs = resize(c.strs, len(op.Parts)+3)
	c.peek = op.Mode == ModePeek
	c.log = op.Ban == nil
	for i := range op.Parts {
		if op.Parts[i].Kind != KindLog {
			c.log = false
		}
	}
	c.fast = fastKind(op, format)

	c.encodeShape(op, format)

	// Now and the deadline go relative to their call's bases (relative):
	// nil until the call is built.
	c.now, c.deadline = op.Now, deadline
	c.wholeNow = c.fast == KindLog && format != LogFormat2
	c.args = append(c.args, c.str(c.shape), nil, nil)
	if o := op.Override; o != nil {
		c.args = append(c.args, c.str(o.Scope))
	}
	for i := range op.Parts {
		p := &op.Parts[i]
		c.keys = append(c.keys, p.Key)
		switch p.Kind {
		case KindShare:
			c.args = append(c.args, c.int(p.Lead), c.int(p.Claim), c.str(p.Sig))
		case KindCalendar:
			for j := range p.Windows {
				w := &p.Windows[j]
				c.args = append(c.args, c.int(w.Bounds[0]), c.int(w.Bounds[1]), c.int(w.Bounds[2]), c.int(w.Bounds[3]))
			}
		}
	}
	if bo := op.Ban; bo != nil {
		c.keys = append(c.keys, bo.Key)
	}
	if l := op.Lease; l != nil {
		c.keys = append(c.keys, l.Key)
		c.args = append(c.args, c.str(l.ID))
	}
	if o := op.Override; o != nil {
		c.keys = append(c.keys, o.Key)
	}
}

// fastKind is the kind whose lua.DecideFast script takes op on the
// EVALSHA path (decide.lua's fast form: mode 0, one part of one window, no
// ban, no lease, no override; sliding_log in format 2 or 3, sliding_counter
// in format 4), or 0.
func fastKind(op *Op, format int) Kind {
	if op.Mode != ModeCheck || len(op.Parts) != 1 || op.Ban != nil || op.Lease != nil || op.Override != nil ||
		len(op.Parts[0].Windows) != 1 {
		return 0
	}
	switch k := op.Parts[0].Kind; {
	case k == KindLog && format != LogFormat1, k == KindFixed, k == KindToken:
		return k
	case k == KindCounter && (format == 0 || format == CounterFormat4):
		return k
	}
	return 0
}

// encodeShape sets c.shape to op's shape, the values a limiter repeats
// from check to check (decide.lua's header), as a JSON array; the string is
// kept while it repeats (no allocation).
func (c *check) encodeShape(op *Op, format int) {
	if cap(c.sb) == 0 {
		c.sb = make([]byte, 0, 32+24*len(op.Parts)+48*op.windows()) // room for most shapes: one allocation
	}
	b := append(c.sb[:0], '[')
	b = strconv.AppendInt(b, int64(op.Mode), 10)
	b = appendValue(b, op.Cost)
	b = appendValue(b, int64(len(op.Parts)))
	b = appendValue(b, boolValue(op.Ban != nil))
	b = appendValue(b, boolValue(op.Lease != nil))
	b = appendValue(b, boolValue(op.Override != nil))
	for i := range op.Parts {
		p := &op.Parts[i]
		kind := int64(p.Kind)
		if p.Kind == KindLog && format == LogFormat1 {
			kind = 7
		} else if p.Kind == KindLog && format != LogFormat2 {
			kind = 11 // format 3, the default
		} else if p.Kind == KindCounter {
			kind = counterKind(format)
		}
		b = appendValue(b, kind)
		b = appendValue(b, int64(len(p.Windows)))
		b = appendValue(b, boolValue(p.Global))
		for j := range p.Windows {
			w := &p.Windows[j]
			// A name is a length's digits or a calendar period's name: no
			// character JSON escapes.
			b = append(append(append(b, ',', '"'), w.Name...), '"')
			if p.Kind != KindCalendar {
				b = appendValue(b, w.Len)
			}
			b = appendValue(b, w.Limit)
			if p.Kind != KindCalendar {
				b = appendValue(b, w.Burst)
			}
		}
	}
	if bo := op.Ban; bo != nil {
		b = appendValue(b, bo.After)
		b = appendValue(b, bo.Within)
		b = appendValue(b, bo.For)
		b = appendValue(b, bo.Wait)
	}
	if l := op.Lease; l != nil {
		b = appendValue(b, l.Max)
		b = appendValue(b, l.Timeout)
	}
	b = append(b, ']')
	if string(b) != c.shape {
		c.shape = string(b)
	}
	c.sb = b
}

// appendValue appends a comma and v's digits to a shape.
func appendValue(b []byte, v int64) []byte {
	return strconv.AppendInt(append(b, ','), v, 10)
}

func boolValue(v bool) int64 {
	if v {
		return 1
	}
	return 0
}

// bases are a call's bases of deadlines and of nows (decide.lua's
// header), taken over its checks (add): each one below the earliest, so
// that every value sent relative to it (value - base) is at least 1 and
// the specials keep their meaning: a deadline of 0 (none) or -1 (none, but
// read TIME), a now of 0 (Redis's clock). The checks of one call ask within
// a batch's wait of each other, so their deadlines, and their nows on the
// caller's clock (clock app), differ by little: a few digits for Redis to
// read where each sent its own 16 (which Lua's strtod reads by its slow
// path, and each a string Redis's Lua makes anew). The nows go whole (base
// 0) in a call holding a check of sliding_log's fast form in format 3,
// whose score is the now's digits as sent (sliding_log.lua's log3_fast):
// formatting them costs Redis more than reading them saves. The base of
// deadlines is 0 when no check has one, and -1 when none has one but one
// asks for TIME (-1): the script reads TIME at the call's start when it is
// not 0, and a check's deadline only when TIME is past the earliest (a
// deadline is µs since 1970 on Redis's clock, so the base of one is never
// 0 or below).
type bases struct {
	deadline, now       int64
	hasDeadline, hasNow bool
	whole, readTime     bool
}

// add takes in one more check of the call.
func (b *bases) add(c *check) {
	if d := c.deadline; d > 0 && (!b.hasDeadline || d-1 < b.deadline) {
		b.deadline, b.hasDeadline = d-1, true
	} else if d == -1 {
		b.readTime = true
	}
	if n := c.now; n != 0 && (!b.hasNow || n-1 < b.now) {
		b.now, b.hasNow = n-1, true
	}
	b.whole = b.whole || c.wholeNow
}

// deadlineBase is the call's base of deadlines.
func (b *bases) deadlineBase() int64 {
	if !b.hasDeadline && b.readTime {
		return -1
	}
	return b.deadline
}

// nowBase is the call's base of nows.
func (b *bases) nowBase() int64 {
	if b.whole {
		return 0
	}
	return b.now
}

// relative sets the check's now and deadline in args relative to its
// call's bases.
func (c *check) relative(b *bases) {
	n, d := c.now, c.deadline
	if n != 0 {
		n -= b.nowBase()
	}
	if d > 0 {
		d -= b.deadlineBase()
	}
	c.args[1], c.args[2] = c.int(n), c.int(d)
}

// int is v for args: itself below 256, else a pointer to its copy.
func (c *check) int(v int64) any {
	if v >= 0 && v < 256 {
		return v
	}
	c.ints = append(c.ints, v)
	return &c.ints[len(c.ints)-1]
}

// str is s for args: a pointer to its copy.
func (c *check) str(s string) any {
	c.strs = append(c.strs, s)
	return &c.strs[len(c.strs)-1]
}

// clear drops what the check points to (keys, names, lease IDs), keeping
// its storage.
func (c *check) clear() {
	clear(c.keys)
	clear(c.args)
	clear(c.strs)
	c.keys, c.args, c.ints, c.strs = c.keys[:0], c.args[:0], c.ints[:0], c.strs[:0]
}

// resize is s emptied, with room for n elements.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// WindowName is the name of a duration window's state in its key: its
// length in µs.
func WindowName(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }

// offsetClock is the Redis store's clock offset (clockOffset, shared
// with the ledger's client: limiter/internal/rediskit), and how it learns
// it.
type offsetClock struct {
	clockOffset
	mu     sync.Mutex  // asking
	asking *timeAsk    // the TIME call in flight while the offset is unknown
	noTime atomic.Bool // Redis refused TIME itself (an ACL without +time on Redis 6)
}

// timeAsk is one TIME call that learns the offset; done is closed when it
// ends, err is then its error.
type timeAsk struct {
	done chan struct{}
	err  error
}

// learnClock learns the offset before a check with deadline d is sent, by
// one TIME call (shared by the checks that wait for it), within d: a check
// that cannot have its deadline on Redis's clock is not sent (its caller
// applies the fail mode, and nothing runs late). The call runs on its own
// goroutine so that d holds whatever the client's timeouts, and a reply it
// reads after d teaches nothing (its round trip would make the offset as
// lenient as it was long). Where Redis
// refuses TIME itself though it answers (NOPERM: a Redis 6 ACL that lets
// the script read TIME but not the caller), the check goes as it did
// before, without a deadline, and its reply teaches the offset.
func (s *RedisStore) learnClock(ctx context.Context, d time.Time) error {
	o := &s.clock
	if o.noTime.Load() {
		return nil
	}
	o.mu.Lock()
	a := o.asking
	if a == nil {
		a = &timeAsk{done: make(chan struct{})}
		o.asking = a
		go s.askTime(a, d)
	}
	o.mu.Unlock()
	t := time.NewTimer(time.Until(d))
	defer t.Stop()
	select {
	case <-a.done:
		if o.Known() {
			return nil
		}
		return a.err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

// askTime is a's TIME call, within d.
func (s *RedisStore) askTime(a *timeAsk, d time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), d)
	defer cancel()
	sent := time.Now()
	cmd := redis.NewTimeCmd(ctx, "time")
	var re redis.Error
	if a.err = s.client.Process(ctx, cmd); a.err == nil && time.Now().After(d) {
		// The reply came after d, the deadline of the checks waiting for
		// it (a client whose timeouts outlast d reads it anyway): a round
		// trip that long would put later checks' deadlines as much later
		// on Redis's clock, and one sent into the next stall would run
		// when Redis resumes though its caller applied the fail mode. No
		// sample: the next check asks again.
		a.err = context.DeadlineExceeded
	} else if a.err == nil {
		s.clock.sample(cmd.Val().UnixMicro(), sent)
	} else if errors.As(a.err, &re) && !IsUnavailable(a.err) {
		s.clock.noTime.Store(true)
		a.err = nil
	}
	s.clock.mu.Lock()
	s.clock.asking = nil
	s.clock.mu.Unlock()
	close(a.done)
}
