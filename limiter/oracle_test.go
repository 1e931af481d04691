package limiter_test

// The oracle: a small, slow model of what the README and docs/decision.md
// promise, written from those documents (and the algorithm headers of
// lua/*.lua, which define each algorithm's arithmetic), not from the
// engine's code. It keeps every admitted request of every bucket in a plain
// log and works each algorithm out from it at every decision, in integers;
// it has no caches, no batching and no breaker. sim_test.go holds the whole
// stack against it.
//
// What the documents leave open, and the oracle decides (each is named
// where it is used): a ban counts a key's denials with the weighted sliding
// count of decide.lua (ban_count), which starts again when a ban starts.

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// oEntry is one admitted request (or count_only record): when and how many
// units.
type oEntry struct {
	t, cost int64
	// T, B: a token bucket's interval and burst when it was written (a
	// record rewrites a token window's state read under another T or B,
	// rescaled, before it adds its units).
	T, B int64
}

// oRule is a limiter's configuration as the oracle reads it.
type oRule struct {
	alg          limiter.Algorithm
	wins, gwins  []limiter.Window
	burst        int64
	regions      bool
	loc          *time.Location
	ban          *limiter.Ban
	conc         bool
	leaseTimeout int64 // µs
	countOnly    bool  // count_only status 401
	queue        limiter.Queue
	dryRun       bool
	fail         limiter.FailMode
	// banCountsConcurrency: a refusal by max_concurrent alone counts
	// toward the ban (the README says it does not).
	banCountsConcurrency bool
}

// oReq is one request as the oracle sees it.
type oReq struct {
	id, region     string
	limits, glimit []int64
	cost           int64
	maxConc        int64
}

func (r *oReq) bucket(rule *oRule) string {
	if rule.regions {
		return r.id + "\x00" + r.region
	}
	return r.id
}

// oWin is one window of a decision.
type oWin struct {
	global           bool
	limit            int64 // capacity
	seconds          int64 // w: the window, the current period, a token bucket's time to fill
	known            bool  // the answer covers it (not: a cost that never fits, a cached denial's other windows)
	fits             bool
	count            int64
	retry, reset     int64 // µs
	denied           bool
	remaining        int64
	period           limiter.Period
	periodStart, end int64
}

// oDecision is what the oracle says a request gets.
type oDecision struct {
	outcome     limiter.Outcome
	pass        bool
	dryRun      bool
	source      limiter.Source
	retry       int64 // µs, before rounding
	wins        []oWin
	banned      bool
	banStarted  bool
	banLeft     int64
	leaseTaken  bool
	leaseDenied bool // the concurrency bound was reached (whatever else denied)
	record      bool // count_only: to record at Done when the status matches
	overridden  bool
}

// RetrySeconds is Retry-After: whole seconds, rounded up, at least 1 on a
// refusal.
func (d *oDecision) RetrySeconds() int64 {
	if d.outcome == limiter.OutcomeAllowed || d.outcome == limiter.OutcomeUnavailable || d.outcome == limiter.OutcomeTooLarge {
		return 0
	}
	return max((d.retry+999999)/1000000, 1)
}

// oOverride is an operator's temporary override of one scope ("" or a
// region) of an identity.
type oOverride struct {
	factor          float64
	limits, glimits map[limiter.Window]int64 // by window: a reload may change the windows
	end             int64                    // µs: live while now < end
}

// oBan is a bucket's penalty box: the denials since the last ban started
// (for the weighted count) and the end of the ban.
type oBan struct {
	denials []int64
	until   int64
}

// oLedger is the global ceiling: per identity, the log of every request it
// admitted in any region (time and units), from which each global window is
// worked out. It is the one place that knows what an identity was admitted
// across its regions, so a model of several data centres (issue 21) can
// lease shares of it and check AdmittedWithin against the global limit.
type oLedger struct {
	logs map[string][]oEntry
}

func newLedger() *oLedger { return &oLedger{logs: map[string][]oEntry{}} }

// Admit records units admitted for identity at t.
func (g *oLedger) Admit(identity string, t, cost int64) {
	g.logs[identity] = append(g.logs[identity], oEntry{t: t, cost: cost})
}

// Log is identity's admitted requests, oldest first.
func (g *oLedger) Log(identity string) []oEntry { return g.logs[identity] }

// AdmittedWithin is the units admitted for identity in (from, to].
func (g *oLedger) AdmittedWithin(identity string, from, to int64) int64 {
	var n int64
	for _, e := range g.logs[identity] {
		if e.t > from && e.t <= to {
			n += e.cost
		}
	}
	return n
}

// oStore is the shared store as the documents describe it: what Redis (or
// the in-process store) holds. A node's fail local store is another one.
type oStore struct {
	// buckets: the admitted entries by state key (segKey): a bucket's
	// duration windows are one key of the algorithm's state, its calendar
	// periods another, so a reload that changes the algorithm starts the
	// duration windows again and keeps the periods (docs/reference.md,
	// "Keys name no window or limit").
	buckets map[string][]oEntry
	ledger  *oLedger
	bans    map[string]*oBan
	drybans map[string]*oBan         // a dry run's would-be bans: only dry runs read them
	leases  map[string]map[int]int64 // bucket → request number → expiry (µs)
	ovs     map[string]map[string]*oOverride
}

func newOStore() *oStore {
	return &oStore{buckets: map[string][]oEntry{}, ledger: newLedger(), bans: map[string]*oBan{}, drybans: map[string]*oBan{},
		leases: map[string]map[int]int64{}, ovs: map[string]map[string]*oOverride{}}
}

// floorDiv is a/b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

// periodBounds is the calendar period holding t in loc: [start, end) in µs.
// A day starts at local midnight, a week on Monday, a month on its first.
func periodBounds(p limiter.Period, t time.Time, loc *time.Location) (int64, int64) {
	l := t.In(loc)
	y, m, d := l.Date()
	var s, e time.Time
	switch p {
	case limiter.PeriodHour:
		// An hour starts when the wall clock reads hh:00 and where the
		// zone's offset changes (docs/decision.md, clocks): the instants
		// of one local date, hour and offset. Offsets are whole minutes.
		key := func(x time.Time) [5]int {
			x = x.In(loc)
			_, off := x.Zone()
			y, m, d := x.Date()
			return [5]int{y, int(m), d, x.Hour(), off}
		}
		k := key(t)
		s = t.Truncate(time.Minute)
		for key(s.Add(-time.Minute)) == k {
			s = s.Add(-time.Minute)
		}
		e = t.Truncate(time.Minute).Add(time.Minute)
		for key(e) == k {
			e = e.Add(time.Minute)
		}
	case limiter.PeriodDay:
		s, e = time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case limiter.PeriodWeek:
		back := (int(l.Weekday()) + 6) % 7
		s, e = time.Date(y, m, d-back, 0, 0, 0, 0, loc), time.Date(y, m, d-back+7, 0, 0, 0, 0, loc)
	default:
		s, e = time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return s.UnixMicro(), e.UnixMicro()
}

// evalLog: sliding_log. The window is (now-W, now]; the request fits when
// the units in it plus its cost are at most the limit; retry: the oldest
// entries leave until the cost fits; reset: the oldest entry leaves.
func evalLog(log []oEntry, W, limit, now, cost int64) (fits bool, count, retry, reset int64) {
	var in []oEntry
	for _, e := range log {
		if e.t > now-W {
			in = append(in, e)
			count += e.cost
		}
	}
	fits = count+cost <= limit
	if len(in) > 0 {
		reset = in[0].t + W - now
	}
	if !fits {
		need, acc := count+cost-limit, int64(0)
		for _, e := range in {
			if acc += e.cost; acc >= need {
				retry = e.t + W - now
				break
			}
		}
	}
	return
}

// evalSpan: a fixed window or calendar period [s, e).
func evalSpan(log []oEntry, s, e, limit, now, cost int64) (fits bool, count, retry, reset int64) {
	for _, x := range log {
		if x.t >= s && x.t < e {
			count += x.cost
		}
	}
	fits = count+cost <= limit
	if count > 0 {
		reset = e - now
	}
	if !fits {
		retry = e - now
	}
	return
}

// evalCounter: sliding_counter in state format 3 (lua/sliding_counter.lua's
// header). The window W is split in buckets of bw = ceil(W/20) µs, bucket m
// holding the c units admitted in [m*bw, (m+1)*bw), the first of them at f
// and the last at l. At t the window (t-W, t] starts at s = t-W in bucket
// m0 = floor(s/bw); with F the units of the later buckets, the estimate is
// F + max(p, c - B), B = ceil(limit/20), where p, m0's part, is 0 once l
// <= s, c while f > s, else 1 + (c-2)(l-s)/(l-f) (the two ends are
// requests, the rest spread evenly between them). A request fits when the
// estimate is at most limit - cost (compared here in whole numbers);
// count: the estimate rounded up; retry: the first whole µs at which it is
// at most limit - cost; reset: the first whole µs at which the count has
// dropped by one. Worked out from the log at each instant, by a search of
// the first such µs (the estimate never grows with time).
func evalCounter(log []oEntry, W, limit, now, cost int64) (fits bool, count, retry, reset int64) {
	bw, B := ceilDiv(W, 20), ceilDiv(limit, 20)
	bucket := func(t int64) (m0, F, c, f, l int64) { // the window at t
		m0 = floorDiv(t-W, bw)
		f, l = math.MaxInt64, math.MinInt64
		for _, x := range log {
			switch m := floorDiv(x.t, bw); {
			case m > m0:
				F += x.cost
			case m == m0 && x.cost > 0:
				c += x.cost
				f, l = min(f, x.t), max(l, x.t)
			}
		}
		return
	}
	le := func(t, target int64) bool { // estimate at t <= target
		_, F, c, f, l := bucket(t)
		s, r := t-W, target-F
		if c == 0 {
			return r >= 0
		}
		if c-B > r {
			return false
		}
		switch {
		case c <= r:
			return true
		case s >= l:
			return r >= 0
		case s < f:
			return false
		}
		return (c-2)*(l-s) <= (r-1)*(l-f)
	}
	est := func(t int64) int64 { // rounded up
		_, F, c, f, l := bucket(t)
		s, p := t-W, int64(0)
		if c > 0 {
			switch {
			case s >= l:
			case s < f:
				p = c
			default:
				p = 1 + ceilDiv((c-2)*(l-s), l-f)
			}
		}
		return F + max(p, c-B)
	}
	until := func(target int64) int64 { // the first d >= 0 with le(now+d, target)
		lo, hi := int64(0), W+2*bw
		for lo < hi {
			if mid := (lo + hi) / 2; le(now+mid, target) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo
	}
	fits = cost <= limit && le(now, limit-cost)
	count = est(now)
	if !fits {
		if cost > limit {
			retry = W
		} else {
			retry = until(limit - cost)
		}
	}
	if count > 0 {
		reset = until(count - 1)
	}
	return
}

// tokenInterval is a token bucket's emission interval: floor(W/limit+0.5)
// whole µs, at least 1.
func tokenInterval(W, limit int64) int64 { return max((2*W+limit)/(2*limit), 1) }

// evalToken: token_bucket as GCRA, replayed over the log: tat starts empty;
// each admitted request sets tat = t + max(tat-t, 0) + T*cost. An entry
// under another T or B than the one before rescales what is due first, as
// a record rewrites a state read under other limits (a reload, an override):
// d = min(ceil(d*T/T_before), B*T). With d = max(tat-now, 0) (rescaled to
// this check's T and B the same way), a request fits when d + T*cost <=
// B*T; count: units in use, B - floor((B*T-d)/T) clamped to [0, B];
// retry: d + T*c - B*T; reset: d. A check that records nothing leaves a
// state of another T or B as it was written (docs/decision.md, state under
// another policy): it drains as written, so with x = max(tat-now, 0), its
// time to full as written, the retry is when it has room, x - (B-c)*T_before,
// and the reset x.
func evalToken(log []oEntry, T, B, now, cost int64) (fits bool, count, retry, reset int64) {
	var tat, cT, cB int64
	rescale := func(d, t, b int64) int64 {
		if cT != 0 && (t != cT || b != cB) {
			d = min(ceilDiv(d*t, cT), b*t)
		}
		return d
	}
	for _, x := range log {
		xT, xB := x.T, x.B
		if xT == 0 {
			xT, xB = T, B
		}
		tat = x.t + rescale(max(tat-x.t, 0), xT, xB)
		cT, cB = xT, xB
		if x.cost > 0 {
			tat += xT * x.cost
		}
	}
	x := max(tat-now, 0)
	d := rescale(x, T, B)
	fits = d+T*cost <= B*T
	count = min(max(B-floorDiv(B*T-d, T), 0), B)
	if !fits {
		retry = d + T*cost - B*T
	}
	reset = d
	if cT != 0 && (T != cT || B != cB) {
		// Left as written if this check records nothing (a record's
		// answer is worked out again after it: reevaluate).
		if !fits {
			retry = x - (B-cost)*cT
		}
		reset = x
	}
	return
}

// evalWindow works out one window of a request over log.
// cfg is the window's configured limit (limit: under an override).
func (r *oRule) evalWindow(w limiter.Window, global bool, limit, cfg int64, log []oEntry, now time.Time, cost int64) oWin {
	n := now.UnixMicro()
	o := oWin{global: global, limit: limit, period: w.Period, known: true}
	if w.Period != limiter.PeriodNone {
		s, e := periodBounds(w.Period, now, r.loc)
		o.periodStart, o.end = s, e
		o.seconds = ceilDiv(e-s, 1e6)
		o.fits, o.count, o.retry, o.reset = evalSpan(log, s, e, limit, n, cost)
		return o
	}
	W := w.Duration.Microseconds()
	o.seconds = ceilDiv(W, 1e6)
	switch r.alg {
	case limiter.SlidingLog:
		o.fits, o.count, o.retry, o.reset = evalLog(log, W, limit, n, cost)
	case limiter.FixedWindow:
		s := floorDiv(n, W) * W
		o.fits, o.count, o.retry, o.reset = evalSpan(log, s, s+W, limit, n, cost)
	case limiter.SlidingCounter:
		o.fits, o.count, o.retry, o.reset = evalCounter(log, W, limit, n, cost)
	default:
		B, T := r.capacity(w, limit, cfg, global), tokenInterval(W, limit)
		o.limit = B
		o.seconds = ceilDiv(B*T, 1e6)
		o.fits, o.count, o.retry, o.reset = evalToken(log, T, B, n, cost)
	}
	return o
}

// capacity is what one request may cost in window w of limit (cfg: its
// configured limit): a token bucket's burst, which follows an override's
// limit in proportion (floor(burst * limit / cfg), at least 1).
func (r *oRule) capacity(w limiter.Window, limit, cfg int64, global bool) int64 {
	if r.alg == limiter.TokenBucket && w.Period == limiter.PeriodNone && r.burst > 0 && !global {
		if limit != cfg {
			return max(r.burst*limit/cfg, 1)
		}
		return r.burst
	}
	return limit
}

// token reports whether window w keeps a token bucket's state.
func (r *oRule) token(w limiter.Window) bool {
	return r.alg == limiter.TokenBucket && w.Period == limiter.PeriodNone
}

// stateKey is the oracle's log of window w of a bucket: its state key's
// (segKey), or for a token bucket's window its own, since each window's
// state is rewritten on its own under another T or B.
func (r *oRule) stateKey(w limiter.Window, bucket string) string {
	if r.token(w) {
		return segKey(r, w, bucket) + "\x02" + w.Duration.String()
	}
	return segKey(r, w, bucket)
}

// tokenTB is window w's token interval and burst at limit (cfg: its
// configured limit).
func (r *oRule) tokenTB(w limiter.Window, limit, cfg int64, global bool) (int64, int64) {
	return tokenInterval(w.Duration.Microseconds(), limit), r.capacity(w, limit, cfg, global)
}

// effective is the request's limits under the identity's live overrides: a
// region's override wins over the identity's in that region; the global
// ceiling takes only the identity's. A factor multiplies (rounded down, at
// least 1).
//
// until is when the first override that changed a limit of the request
// ends (0: none did): nothing decided under it outlives it (docs/decision.md,
// state and its invalidation).
func (s *oStore) effective(q *oReq, rule *oRule, now int64) (limits, glimits []int64, overridden bool, until int64) {
	limits, glimits = append([]int64(nil), q.limits...), append([]int64(nil), q.glimit...)
	ov := s.ovs[q.id]
	apply := func(o *oOverride, dst []int64, wins []limiter.Window, given map[limiter.Window]int64) {
		for i := range dst {
			was := dst[i]
			if o.factor > 0 {
				dst[i] = max(int64(float64(dst[i])*o.factor), 1)
			} else if v, ok := given[wins[i]]; ok {
				dst[i] = v
			}
			if dst[i] != was && (until == 0 || o.end < until) {
				until = o.end
			}
		}
	}
	all, reg := ov[""], (*oOverride)(nil)
	if rule.regions {
		reg = ov["r:"+q.region]
	}
	if all != nil && all.end <= now {
		all = nil
	}
	if reg != nil && reg.end <= now {
		reg = nil
	}
	switch {
	case reg != nil:
		apply(reg, limits, rule.wins, reg.limits)
		overridden = true
	case all != nil:
		apply(all, limits, rule.wins, all.limits)
		overridden = true
	}
	if all != nil && len(rule.gwins) > 0 {
		apply(all, glimits, rule.gwins, all.glimits)
		overridden = true
	}
	return limits, glimits, overridden, until
}

// banCount adds a denial at now to b and reports whether it bans the key:
// the weighted sliding count over within (the spans idx = floor(t/within),
// the previous one weighted by its share still in the span) reaches after.
func banCount(b *oBan, rule *limiter.Ban, now int64) bool {
	b.denials = append(b.denials, now)
	W := rule.Within.Microseconds()
	idx := floorDiv(now, W)
	var c, p int64
	for _, t := range b.denials {
		switch floorDiv(t, W) {
		case idx:
			c++
		case idx - 1:
			p++
		}
	}
	if p*(W-(now-idx*W))+c*W >= rule.After*W {
		b.denials, b.until = nil, now+rule.For.Microseconds()
		return true
	}
	return false
}

// liveLeases is the bucket's leases that have not expired at now.
func (s *oStore) liveLeases(bucket string, now int64) int64 {
	var n int64
	for _, exp := range s.leases[bucket] {
		if exp > now {
			n++
		}
	}
	return n
}

// Decide is the store's answer to a check (checkOnly: count_only's check
// before the response, which records nothing), made and recorded at now.
// reqNo names the request's lease. waitLeft (µs; -1: none) is how long the
// request may still wait in the queue: a refusal it will wait out is not a
// client's denial (the ban counts a queued request once, at its last
// refusal).
func (s *oStore) Decide(rule *oRule, q *oReq, now time.Time, checkOnly bool, reqNo int, waitLeft int64) oDecision {
	n := now.UnixMicro()
	cost := max(q.cost, 1)
	d := oDecision{}
	bucket := q.bucket(rule)
	limits, glimits, ov, ovEnd := s.effective(q, rule, n)
	d.overridden = ov
	tooLarge := false
	for i, w := range rule.wins {
		tooLarge = tooLarge || cost > rule.capacity(w, limits[i], q.limits[i], false)
	}
	for i, w := range rule.gwins {
		tooLarge = tooLarge || cost > rule.capacity(w, glimits[i], q.glimit[i], true)
	}
	if tooLarge {
		// An override lowered a capacity below the cost: 413, nothing
		// written, no window read.
		d.outcome = limiter.OutcomeTooLarge
		for i, w := range rule.wins {
			d.wins = append(d.wins, oWin{limit: rule.capacity(w, limits[i], q.limits[i], false), seconds: rule.evalWindow(w, false, limits[i], q.limits[i], nil, now, 0).seconds})
		}
		for i, w := range rule.gwins {
			d.wins = append(d.wins, oWin{global: true, limit: glimits[i], seconds: rule.evalWindow(w, true, glimits[i], q.glimit[i], nil, now, 0).seconds})
		}
		return d
	}
	// A token state read under another T or B is rewritten under this
	// check's only when it records (docs/decision.md, state under another
	// policy): a check that records nothing leaves the log as it is.
	for i, w := range rule.wins {
		k := rule.stateKey(w, bucket)
		d.wins = append(d.wins, rule.evalWindow(w, false, limits[i], q.limits[i], s.buckets[k], now, cost))
	}
	for i, w := range rule.gwins {
		k := rule.stateKey(w, q.id)
		d.wins = append(d.wins, rule.evalWindow(w, true, glimits[i], q.glimit[i], s.ledger.Log(k), now, cost))
	}
	fits := true
	for i := range d.wins {
		fits = fits && d.wins[i].fits
		if w := &d.wins[i]; ovEnd > 0 && w.retry > ovEnd-n {
			w.retry = ovEnd - n
		}
	}
	bans := s.bans
	if rule.dryRun {
		// A dry run counts its would-be refusals toward a ban of its own,
		// and reads only that one (docs/decision.md: what a dry run writes).
		bans = s.drybans
	}
	b := bans[bucket]
	if rule.ban != nil && b != nil && b.until > n {
		d.banned, d.banLeft = true, b.until-n
	}
	leaseDenied := rule.conc && s.liveLeases(bucket, n) >= q.maxConc
	d.leaseDenied = leaseDenied
	allowed := !d.banned && fits && !leaseDenied
	if allowed {
		if !checkOnly {
			s.record(rule, q, bucket, n, cost, limits, glimits)
			s.reevaluate(rule, q, &d, limits, glimits, now)
		}
		if rule.conc {
			if s.leases[bucket] == nil {
				s.leases[bucket] = map[int]int64{}
			}
			s.leases[bucket][reqNo] = n + rule.leaseTimeout
			d.leaseTaken = true
		}
		d.record = checkOnly
	}
	for i := range d.wins {
		w := &d.wins[i]
		w.denied = !allowed && !w.fits
		if w.denied {
			w.reset, w.remaining = w.retry, 0
		} else {
			w.remaining = max(w.limit-w.count, 0)
		}
	}
	switch {
	case allowed:
		d.outcome, d.pass = limiter.OutcomeAllowed, true
	case d.banned:
		d.outcome = limiter.OutcomeBanned
	case leaseDenied && fits:
		d.outcome = limiter.OutcomeConcurrency
	default:
		d.outcome = limiter.OutcomeLimited
	}
	if !allowed && !d.banned && rule.ban != nil &&
		(d.outcome != limiter.OutcomeConcurrency || rule.banCountsConcurrency) &&
		!(d.outcome == limiter.OutcomeLimited && d.retryOf() <= waitLeft) {
		if b == nil {
			b = &oBan{}
			bans[bucket] = b
		}
		if banCount(b, rule.ban, n) {
			d.banned, d.banStarted, d.banLeft = true, true, rule.ban.For.Microseconds()
			d.outcome = limiter.OutcomeBanned
		}
	}
	d.retry = d.retryOf()
	return d
}

// retryOf is the time until the request would be admitted: the latest
// retry of the windows that denied it, the ban's end, a second for the
// concurrency bound.
func (d *oDecision) retryOf() int64 {
	var t int64
	for _, w := range d.wins {
		if w.denied {
			t = max(t, w.retry)
		}
	}
	switch d.outcome {
	case limiter.OutcomeAllowed:
		return 0
	case limiter.OutcomeBanned:
		t = max(t, d.banLeft)
	case limiter.OutcomeConcurrency:
		t = max(t, time.Second.Microseconds())
	}
	return t
}

// segment is the store's state key segment of window w under rule: the
// algorithm's state, or the calendar periods'.
func (r *oRule) segment(w limiter.Window) string {
	if w.Period != limiter.PeriodNone {
		return "calendar"
	}
	return r.alg.String()
}

// segKey is the state key of window w of a bucket (or, global, of the
// identity's ceiling).
func segKey(rule *oRule, w limiter.Window, bucket string) string {
	return rule.segment(w) + "\x01" + bucket
}

// record adds units to the bucket's logs and the ledger's, under the
// request's limits (a token bucket's entries carry its T and B).
func (s *oStore) record(rule *oRule, q *oReq, bucket string, n, cost int64, limits, glimits []int64) {
	add := func(logs map[string][]oEntry, wins []limiter.Window, lim, cfg []int64, b string, global bool) {
		var done []string
		for i, w := range wins {
			e, k := oEntry{t: n, cost: cost}, rule.stateKey(w, b)
			if rule.token(w) {
				e.T, e.B = rule.tokenTB(w, lim[i], cfg[i], global)
			} else if slices.Contains(done, k) {
				continue
			}
			done = append(done, k)
			logs[k] = append(logs[k], e)
		}
	}
	add(s.buckets, rule.wins, limits, q.limits, bucket, false)
	add(s.ledger.logs, rule.gwins, glimits, q.glimit, q.id, true)
}

// reevaluate fills the windows' count and reset after the request was
// recorded.
func (s *oStore) reevaluate(rule *oRule, q *oReq, d *oDecision, limits, glimits []int64, now time.Time) {
	bucket := q.bucket(rule)
	for i, w := range rule.wins {
		a := rule.evalWindow(w, false, limits[i], q.limits[i], s.buckets[rule.stateKey(w, bucket)], now, 0)
		d.wins[i].count, d.wins[i].reset = a.count, a.reset
	}
	for i, w := range rule.gwins {
		a := rule.evalWindow(w, true, glimits[i], q.glimit[i], s.ledger.Log(rule.stateKey(w, q.id)), now, 0)
		j := len(rule.wins) + i
		d.wins[j].count, d.wins[j].reset = a.count, a.reset
	}
}

// Record is count_only's record after a response whose status matches: the
// units go into every window, whatever is left.
func (s *oStore) Record(rule *oRule, q *oReq, now time.Time) {
	limits, glimits, _, _ := s.effective(q, rule, now.UnixMicro())
	s.record(rule, q, q.bucket(rule), now.UnixMicro(), max(q.cost, 1), limits, glimits)
}

// Release gives a request's lease back.
func (s *oStore) Release(bucket string, reqNo int) { delete(s.leases[bucket], reqNo) }

// Reset forgets a bucket (and the identity's global ceiling, and its ban):
// the admin DELETE. Leases and overrides stay.
func (s *oStore) Reset(rule *oRule, q *oReq) {
	b := q.bucket(rule)
	forget := func(logs map[string][]oEntry, b string) {
		for _, seg := range oSegments {
			delete(logs, seg+"\x01"+b)
			for k := range logs {
				if strings.HasPrefix(k, seg+"\x01"+b+"\x02") {
					delete(logs, k)
				}
			}
		}
	}
	forget(s.buckets, b)
	delete(s.bans, b)
	delete(s.drybans, b)
	if len(rule.gwins) > 0 {
		forget(s.ledger.logs, q.id)
	}
}

// oSegments are every state segment a bucket may have: an admin reset
// forgets them all, whichever algorithm wrote them.
var oSegments = []string{"sliding_log", "sliding_counter", "fixed_window", "token_bucket", "calendar"}

// SetOverride sets the override of scope ("" or "r:<region>").
func (s *oStore) SetOverride(id, scope string, o oOverride) {
	if s.ovs[id] == nil {
		s.ovs[id] = map[string]*oOverride{}
	}
	s.ovs[id][scope] = &o
}

// DeleteOverride ends an override early.
func (s *oStore) DeleteOverride(id, scope string) { delete(s.ovs[id], scope) }

// FailRule is what a fail mode promises for a request the store could not
// decide (an outage, an open circuit, a timeout): fail open passes it
// (source fail_open, no windows known), fail closed refuses it (503, source
// fail_closed), fail local is the node's own in-process store's answer
// (source local); a dry run passes every refusal; nothing is written to the
// shared store.
func FailRule(rule *oRule, local *oStore, q *oReq, now time.Time, checkOnly bool, reqNo int, waitLeft int64) oDecision {
	var d oDecision
	switch rule.fail {
	case limiter.FailOpen:
		d = oDecision{outcome: limiter.OutcomeUnavailable, pass: true, source: limiter.SourceFailOpen}
	case limiter.FailClosed:
		d = oDecision{outcome: limiter.OutcomeUnavailable, source: limiter.SourceFailClosed}
	default:
		// The in-process fallback applies the configured limits: it knows
		// no override.
		d = local.Decide(rule, q, now, checkOnly, reqNo, waitLeft)
		d.source = limiter.SourceLocal
	}
	return d
}

// Finish applies the dry run: a would-be refusal passes.
func (rule *oRule) Finish(d oDecision) oDecision {
	if rule.dryRun && !d.pass {
		d.pass, d.dryRun = true, true
	}
	return d
}

// tooLarge is the static 413: a cost above a configured capacity never
// reaches the store.
func (rule *oRule) tooLarge(q *oReq) bool {
	cost := max(q.cost, 1)
	for i, w := range rule.wins {
		if cost > rule.capacity(w, q.limits[i], q.limits[i], false) {
			return true
		}
	}
	for i, w := range rule.gwins {
		if cost > rule.capacity(w, q.glimit[i], q.glimit[i], true) {
			return true
		}
	}
	return false
}

func (d oDecision) String() string {
	s := fmt.Sprintf("%s pass=%v dry=%v source=%s retry=%dµs (Retry-After %d) banned=%v started=%v", d.outcome, d.pass, d.dryRun,
		d.source, d.retry, d.RetrySeconds(), d.banned, d.banStarted)
	for _, w := range d.wins {
		s += fmt.Sprintf(" [limit %d w %d count %d denied %v remaining %d retry %d]", w.limit, w.seconds, w.count, w.denied, w.remaining, w.retry)
	}
	return s
}
