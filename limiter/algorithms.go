package limiter

import (
	"math"
	"sort"
)

// The in-process twins of lua/*.lua. Redis runs Lua with IEEE doubles, so
// the hash kinds compute in float64 and repeat the scripts' arithmetic
// operation by operation, in the same order, with the same floor/ceil: the
// two stores give bit-identical answers (TestDifferential holds them to it).
// Products are wrapped in explicit float64 conversions so the compiler cannot
// fuse them into an FMA (Lua rounds every operation). Read them side by side
// with the scripts; the comments there explain the why.

// winState is the stored state of one window of a hash kind, as its fields:
//
//	counter:  a = the newest bucket's index, ring = the buckets' units,
//	          first and last times (N + 1 of each, by slot)
//	fixed:    a = index, b = units
//	token:    a = tat, b = interval, c = burst
//	calendar: a = start, b = end, c = units
type winState struct {
	name    string
	a, b, c int64
	ring    []int64 // counter: buckets a - N .. a, bucket m at slot m % (N + 1): units, firsts, lasts
}

// winEval is one window's check, with what recording it needs (the
// scripts' s1..s4).
type winEval struct {
	count, retry, reset int64
	s1, s2, s3, s4      float64
	ring                ctrRing // counter: its buckets (s1 the newest, s2 the time it is decided at)
}

// ---- sliding_counter ----------------------------------------------------

// CounterBuckets is N, the buckets a sliding_counter window is split in
// (lua/sliding_counter.lua's CTR3_N, state format 3): a window of length w
// keeps, for each of its N + 1 newest buckets of bw = ceil(w / N) µs, the
// units admitted in it and the first and last µs one was.
const CounterBuckets = 20

const ctrSlots = CounterBuckets + 1

// ctrEst is ctr_est: the two-counter estimate of state format 1 (and of a
// ban's weighted count), at t (t >= idx * w) of a window whose index idx
// holds cur units and idx - 1 prev units.
func ctrEst(w, t, idx, cur, prev float64) float64 {
	k := math.Floor(t / w)
	if k == idx {
		return float64(prev*(w-(t-float64(idx*w))))/w + cur
	}
	if k == idx+1 {
		return float64(cur*(w-(t-float64(k*w)))) / w
	}
	return 0
}

// ctrSlot is the slot of bucket m, Lua's m % (N + 1) for a bucket index
// (a whole number, 0 <= m < 2^63): an integer remainder, where math.Mod's
// general float loop cost more than the rest of a check.
func ctrSlot(m float64) int {
	x := int64(m) % ctrSlots
	if x < 0 {
		x += ctrSlots
	}
	return int(x)
}

// ctrRing is one window's buckets: bucket m of (k - ctrSlots, k] holds
// c[m % ctrSlots] units, the first admitted at f[...] and the last at
// l[...] (µs; meaningless while c is 0).
type ctrRing struct {
	c, f, l [ctrSlots]float64
}

// ctrWin is one window's buckets as ctr3_sums leaves them: sfx[i] is the
// units of buckets k - ctrSlots + 1 + i .. k (sfx[ctrSlots] = 0).
type ctrWin struct {
	w, bw, b, k float64
	r           *ctrRing
	sfx         [ctrSlots + 1]float64
}

// sums is ctr3_sums.
func (s *ctrWin) sums() {
	s.sfx[ctrSlots] = 0
	for i := ctrSlots - 1; i >= 0; i-- {
		m := s.k - ctrSlots + 1 + float64(i)
		s.sfx[i] = s.sfx[i+1] + s.r.c[ctrSlot(m)]
	}
}

// after is the units of the buckets after m (m >= k - ctrSlots).
func (s *ctrWin) after(m float64) float64 { return s.sfx[int(m-(s.k-ctrSlots+1))+1] }

// le is ctr3_le: whether the estimate at t (t >= k * bw) is at most
// target (a whole number), compared in whole numbers.
func (s *ctrWin) le(t, target float64) bool {
	st := t - s.w
	m0 := math.Floor(st / s.bw)
	if m0 > s.k {
		return target >= 0
	}
	r := target - s.after(m0)
	i := ctrSlot(m0)
	c := s.r.c[i]
	switch {
	case c == 0:
		return r >= 0
	case c-s.b > r:
		return false
	case c <= r:
		return true
	}
	f, l := s.r.f[i], s.r.l[i]
	switch {
	case st >= l:
		return r >= 0
	case st < f:
		return false
	}
	return float64((c-2)*(l-st)) <= float64((r-1)*(l-f))
}

// count is ctr3_count: the estimate at t rounded up.
func (s *ctrWin) count(t float64) float64 {
	st := t - s.w
	m0 := math.Floor(st / s.bw)
	if m0 > s.k {
		return 0
	}
	i := ctrSlot(m0)
	c := s.r.c[i]
	part := 0.0
	if c > 0 {
		f, l := s.r.f[i], s.r.l[i]
		switch {
		case st >= l:
		case st < f:
			part = c
		default:
			part = 1 + math.Ceil(float64((c-2)*(l-st))/(l-f))
		}
		if c-s.b > part {
			part = c - s.b
		}
	}
	return s.after(m0) + part
}

// until is ctr3_until: the smallest whole d >= 0 with le(base + d,
// target), segment by segment (the oldest bucket m fixed in each).
func (s *ctrWin) until(target, base float64) float64 {
	if s.le(base, target) {
		return 0
	}
	for m := math.Floor((base - s.w) / s.bw); m <= s.k; m++ {
		lo := float64(m * s.bw)
		if base-s.w > lo {
			lo = base - s.w
		}
		r := target - s.after(m)
		i := ctrSlot(m)
		c := s.r.c[i]
		if r < 0 || c-s.b > r {
			continue
		}
		at := lo
		if c > r {
			f, l := s.r.f[i], s.r.l[i]
			x := l
			if r >= 1 && l > f {
				x = f
				if c > 2 {
					x = l - math.Floor(float64((r-1)*(l-f))/(c-2))
					if x < f {
						x = f
					}
				}
			}
			if x > at {
				at = x
			}
		}
		return at + s.w - base
	}
	at := float64((s.k + 1) * s.bw)
	if base-s.w > at {
		at = base - s.w
	}
	return at + s.w - base
}

// ctrBucket is a window's bucket length, ceil(w / N), and the units one
// bucket may hold beyond the estimate, B = ceil(limit / N).
func ctrBucket(w, limit float64) (bw, b float64) {
	return math.Ceil(w / CounterBuckets), math.Ceil(limit / CounterBuckets)
}

// ctrFill fills r with the buckets of (k - ctrSlots, k] that a stored
// state of newest bucket st.a holds (st.ring: the units, then the firsts,
// then the lasts, by slot).
func ctrFill(r *ctrRing, st *winState, k float64) {
	for i := 0; i < ctrSlots; i++ {
		m := k - ctrSlots + 1 + float64(i)
		x := ctrSlot(m)
		r.c[x], r.f[x], r.l[x] = 0, 0, 0
		if m <= float64(st.a) && m > float64(st.a)-ctrSlots {
			r.c[x], r.f[x], r.l[x] = float64(st.ring[x]), float64(st.ring[ctrSlots+x]), float64(st.ring[2*ctrSlots+x])
		}
	}
}

// ctrCarry is ctr3_carry: the units that the states of other lengths
// (windows that a reload replaced) still hold at now, their oldest bucket
// counted whole: the most of them.
func ctrCarry(states []winState, wins []Win, now float64) float64 {
	most := 0.0
	for i := range states {
		st := &states[i]
		if isWindow(st.name, wins) || len(st.ring) != 3*ctrSlots {
			continue
		}
		l := parseLen(st.name)
		if l <= 0 {
			continue
		}
		var ring ctrRing
		s := ctrWin{w: l, bw: math.Ceil(l / CounterBuckets), k: float64(st.a), r: &ring}
		ctrFill(&ring, st, s.k)
		s.sums()
		t := now
		if float64(s.k*s.bw) > t {
			t = float64(s.k * s.bw)
		}
		m0 := math.Floor((t - l) / s.bw)
		est := 0.0
		if m0 <= s.k {
			est = s.after(m0) + ring.c[ctrSlot(m0)]
		}
		if est > most {
			most = est
		}
	}
	return most
}

func ctrCheck(states []winState, wins []Win, evs []winEval, now, cost float64) bool {
	fits := true
	carried, haveCarry := 0.0, false
	for j := range wins {
		w, limit := float64(wins[j].Len), float64(wins[j].Limit)
		bw, b := ctrBucket(w, limit)
		ev := &evs[j]
		*ev = winEval{}
		k := math.Floor(now / bw)
		base := now
		if st := stateOf(states, wins[j].Name); st != nil && len(st.ring) == 3*ctrSlots {
			if float64(st.a) > k {
				k = float64(st.a)
				base = float64(k * bw)
			}
			ctrFill(&ev.ring, st, k)
		} else {
			if !haveCarry {
				carried, haveCarry = ctrCarry(states, wins, now), true
			}
			if carried > 0 {
				x := ctrSlot(k)
				ev.ring.c[x], ev.ring.f[x], ev.ring.l[x] = carried, base, base
			}
		}
		s := ctrWin{w: w, bw: bw, b: b, k: k, r: &ev.ring}
		s.sums()
		count := s.count(base)
		retry := 0.0
		if cost > limit {
			retry = w
		} else if !s.le(base, limit-cost) {
			retry = s.until(limit-cost, base) + (base - now)
		}
		if retry > 0 {
			fits = false
		}
		ev.count, ev.retry, ev.s1, ev.s2 = int64(count), int64(retry), k, base
	}
	return fits
}

// ctrRecord is ctr3_record: the new states and the TTL in ms.
func ctrRecord(wins []Win, evs []winEval, cost float64, out []winState) ([]winState, int64) {
	ttl := 0.0
	for j := range wins {
		ev := &evs[j]
		w := float64(wins[j].Len)
		bw, _ := ctrBucket(w, float64(wins[j].Limit))
		i := ctrSlot(ev.s1)
		if cost > 0 {
			t := ev.s2
			if ev.ring.c[i] == 0 {
				ev.ring.f[i], ev.ring.l[i] = t, t
			} else {
				if t < ev.ring.f[i] {
					ev.ring.f[i] = t
				}
				if t > ev.ring.l[i] {
					ev.ring.l[i] = t
				}
			}
			ev.ring.c[i] = ev.ring.c[i] + cost
		}
		ev.count += int64(cost)
		// A state rewritten in place keeps its buckets' storage.
		var ring []int64
		if len(out) < cap(out) {
			ring = out[: len(out)+1 : len(out)+1][len(out)].ring
		}
		if len(ring) != 3*ctrSlots {
			ring = make([]int64, 3*ctrSlots)
		}
		for x := 0; x < ctrSlots; x++ {
			ring[x], ring[ctrSlots+x], ring[2*ctrSlots+x] = int64(ev.ring.c[x]), int64(ev.ring.f[x]), int64(ev.ring.l[x])
		}
		out = append(out, winState{name: wins[j].Name, a: int64(ev.s1), ring: ring})
		if t := math.Ceil((w+bw)/1000) + 1000; t > ttl {
			ttl = t
		}
	}
	return out, int64(ttl)
}

// ctrReset is ctr3_reset: the first µs at which the count (the estimate
// rounded up, after any record) has dropped by one.
func ctrReset(wins []Win, evs []winEval, now float64) {
	for j := range wins {
		ev := &evs[j]
		w := float64(wins[j].Len)
		bw, b := ctrBucket(w, float64(wins[j].Limit))
		s := ctrWin{w: w, bw: bw, b: b, k: ev.s1, r: &ev.ring}
		s.sums()
		reset := 0.0
		if n := s.count(ev.s2); n > 0 {
			reset = s.until(n-1, ev.s2) + (ev.s2 - now)
		}
		ev.reset = int64(reset)
	}
}

// stateOf is the stored state of window name, or nil.
func stateOf(states []winState, name string) *winState {
	for i := range states {
		if states[i].name == name {
			return &states[i]
		}
	}
	return nil
}

// isWindow is is_window.
func isWindow(name string, wins []Win) bool {
	for i := range wins {
		if wins[i].Name == name {
			return true
		}
	}
	return false
}

// ---- fixed_window and calendar periods -----------------------------------

// fixCarry is fix_carry.
func fixCarry(states []winState, wins []Win, now float64) float64 {
	most := 0.0
	for i := range states {
		st := &states[i]
		if isWindow(st.name, wins) {
			continue
		}
		l, idx, n := parseLen(st.name), float64(st.a), float64(st.b)
		if l > 0 && float64((idx+1)*l) > now && n > most {
			most = n
		}
	}
	return most
}

// spanEval is span_eval: a window whose count holds over the span [s, e)
// around now; it reports whether cost fits.
func spanEval(count, cost, limit, s, e, now float64) (winEval, bool) {
	var ev winEval
	if count > 0 {
		ev.reset = int64(e - now)
	}
	fits := count+cost <= limit
	if !fits {
		if cost > limit {
			ev.retry = int64(e - s)
		} else {
			ev.retry = int64(e - now)
		}
	}
	ev.count, ev.s2 = int64(count), e
	return ev, fits
}

func fixCheck(states []winState, wins []Win, evs []winEval, now, cost float64) bool {
	fits := true
	carried, haveCarry := 0.0, false
	for j := range wins {
		w, limit := float64(wins[j].Len), float64(wins[j].Limit)
		idx := math.Floor(now / w)
		count := 0.0
		if st := stateOf(states, wins[j].Name); st != nil {
			sw := float64(st.a)
			if sw == idx {
				count = float64(st.b)
			} else if sw > idx {
				idx, count = sw, float64(st.b)
			}
		} else {
			if !haveCarry {
				carried, haveCarry = fixCarry(states, wins, now), true
			}
			count = carried
		}
		ev, ok := spanEval(count, cost, limit, idx*w, (idx+1)*w, now)
		fits = fits && ok
		ev.s1 = idx
		evs[j] = ev
	}
	return fits
}

// spanAdd is span_add: it adds cost to a window spanEval filled and
// returns the TTL (ms) its state needs.
func spanAdd(ev *winEval, now, cost float64) float64 {
	ev.count += int64(cost)
	ev.reset = int64(ev.s2 - now)
	return math.Ceil((ev.s2-now)/1000) + 1000
}

func fixRecord(wins []Win, evs []winEval, now, cost float64, out []winState) ([]winState, int64) {
	ttl := 0.0
	for j := range wins {
		ev := &evs[j]
		ttl = math.Max(ttl, spanAdd(ev, now, cost))
		out = append(out, winState{name: wins[j].Name, a: int64(ev.s1), b: ev.count})
	}
	return out, int64(ttl)
}

func calCheck(states []winState, wins []Win, evs []winEval, now, cost float64) bool {
	fits := true
	for j := range wins {
		b, limit := &wins[j].Bounds, float64(wins[j].Limit)
		s, e := float64(b[1]), float64(b[2])
		if now < float64(b[1]) {
			s, e = float64(b[0]), float64(b[1])
		} else if now >= float64(b[2]) {
			s, e = float64(b[2]), float64(b[3])
		}
		count := 0.0
		if st := stateOf(states, wins[j].Name); st != nil {
			ss, se := float64(st.a), float64(st.b)
			if ss == s || (ss <= now && now < se) {
				count = float64(st.c)
			}
		}
		ev, ok := spanEval(count, cost, limit, s, e, now)
		fits = fits && ok
		ev.s1 = s
		evs[j] = ev
	}
	return fits
}

func calRecord(wins []Win, evs []winEval, now, cost float64, out []winState) ([]winState, int64) {
	ttl := 0.0
	for j := range wins {
		ev := &evs[j]
		ttl = math.Max(ttl, spanAdd(ev, now, cost))
		out = append(out, winState{name: wins[j].Name, a: int64(ev.s1), b: int64(ev.s2), c: ev.count})
	}
	return out, int64(ttl)
}

// ---- token_bucket ----------------------------------------------------------

// tbInUse is tb_in_use.
func tbInUse(d, burst, interval float64) float64 {
	remaining := math.Floor((float64(burst*interval) - d) / interval)
	if remaining < 0 {
		remaining = 0
	} else if remaining > burst {
		remaining = burst
	}
	return burst - remaining
}

// tbDue is tb_due; wi and wb are the stored interval and burst (NaN when
// the state has none).
func tbDue(tat, wi, wb, now, burst, interval float64) float64 {
	d := tat - now
	if d < 0 {
		d = 0
	}
	if wi != interval || wb != burst {
		if wi > 0 {
			d = math.Ceil(float64(d*interval) / wi)
		}
		if d > float64(burst*interval) {
			d = float64(burst * interval)
		}
	}
	return d
}

// tbCheck is tb_check; stale reports a state written under another
// interval or burst. rewrite: the check rewrites the hash even when it
// records nothing (a window a reload replaced); else a state under another
// interval or burst that the check does not record in is left as written,
// and its retry and reset are its own: x - (B - c) * T_old and x, x its
// time to full as written.
func tbCheck(states []winState, wins []Win, evs []winEval, now, cost float64, rewrite bool) (fits, stale bool) {
	fits = true
	for j := range wins {
		w, limit := float64(wins[j].Len), float64(wins[j].Limit)
		burst := float64(wins[j].Burst)
		if burst <= 0 {
			burst = limit
		}
		interval := math.Floor(w/limit + 0.5)
		if interval < 1 {
			interval = 1
		}
		d := 0.0
		x, wo := -1.0, interval // a state left as written: its x (else -1) and T_old
		if st := stateOf(states, wins[j].Name); st != nil {
			d = tbDue(float64(st.a), float64(st.b), float64(st.c), now, burst, interval)
			if float64(st.b) != interval || float64(st.c) != burst {
				stale = true
				if !rewrite {
					x = math.Max(float64(st.a)-now, 0)
					if st.b > 0 {
						wo = float64(st.b)
					}
				}
			}
		} else {
			for i := range states {
				if st := &states[i]; !isWindow(st.name, wins) {
					if od := tbDue(float64(st.a), float64(st.b), math.NaN(), now, burst, interval); od > d {
						d = od
					}
				}
			}
		}
		retry := 0.0
		if cost > burst {
			retry = w
		} else if allowAt := d + float64(interval*cost) - float64(burst*interval); allowAt > 0 {
			retry = allowAt
		}
		reset := d
		if x >= 0 {
			reset = x
			if retry > 0 && cost <= burst {
				retry = x - (burst-cost)*wo
			}
		}
		if retry > 0 {
			fits = false
		}
		evs[j] = winEval{count: int64(tbInUse(d, burst, interval)), retry: int64(retry), reset: int64(reset), s1: burst, s2: interval, s3: d}
	}
	return fits, stale
}

func tbRecord(wins []Win, evs []winEval, now, cost float64, out []winState) ([]winState, int64) {
	ttl := 0.0
	for j := range wins {
		ev := &evs[j]
		d := ev.s3 + float64(ev.s2*cost)
		ev.count = int64(tbInUse(d, ev.s1, ev.s2))
		ev.reset = int64(d)
		out = append(out, winState{name: wins[j].Name, a: int64(now + d), b: int64(ev.s2), c: int64(ev.s1)})
		if t := math.Ceil(d/1000) + 1000; t > ttl {
			ttl = t
		}
	}
	return out, int64(ttl)
}

// parseLen is tonumber of a window's name (0 when it is not a number).
func parseLen(name string) float64 {
	var n float64
	if name == "" {
		return 0
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + float64(c-'0')
	}
	return n
}

// ---- sliding_log ------------------------------------------------------------

// logEntry is one admitted request: its time and the units before it (B).
type logEntry struct{ t, b int64 }

// logState is sliding_log.lua's sorted set in format 2: the entries from
// head on, and T (kept across the entries, where the script starts it again
// from nothing when a key has none: only differences of B are answers).
type logState struct {
	entries []logEntry
	head    int
	total   int64
}

func (l *logState) live() []logEntry { return l.entries[l.head:] }

// prune drops the entries at or before cut, as ZREMRANGEBYSCORE 0 cut.
func (l *logState) prune(cut int64) {
	e := l.live()
	// Between two requests of a key, few entries leave: look at the
	// oldest first, and search (touching entries all over the log) only
	// past it.
	var n int
	switch {
	case len(e) == 0 || e[0].t > cut:
		n = 0
	case len(e) == 1 || e[1].t > cut:
		n = 1
	default:
		n = 2 + sort.Search(len(e)-2, func(i int) bool { return e[2+i].t > cut })
	}
	l.head += n
	if l.head == len(l.entries) {
		l.entries, l.head = l.entries[:0], 0
	} else if l.head > 32 && l.head > len(l.entries)/2 {
		l.entries = append(l.entries[:0], l.entries[l.head:]...)
		l.head = 0
	}
}

// MaxLogEntries bounds a sliding log: the requests (one entry each,
// whatever their cost) one key holds in its longest window.
const MaxLogEntries = 10000

// logCheck is log_check.
func logCheck(l *logState, wins []Win, evs []winEval, now, cost int64, peek bool) bool {
	var maxw int64
	for j := range wins {
		maxw = max(maxw, wins[j].Len)
	}
	if !peek {
		l.prune(now - maxw)
	}
	e := l.live()
	fits := true
	var full int64
	if len(e) > 0 && l.total-e[0].b >= MaxLogEntries && len(e) >= MaxLogEntries {
		full = e[0].t + maxw - now
	}
	for j := range wins {
		w, limit := wins[j].Len, wins[j].Limit
		first := 0
		if len(e) > 0 && e[0].t <= now-w {
			first = sort.Search(len(e), func(i int) bool { return e[i].t > now-w })
		}
		var ev winEval
		if first < len(e) {
			ev.count = l.total - e[first].b
			ev.reset = e[first].t + w - now
		}
		if ev.count+cost > limit {
			fits = false
			if cost > limit {
				ev.retry = w
			} else {
				x := l.total + cost - limit
				// The last entry with B < x leaves first.
				p := first + sort.Search(len(e)-first, func(i int) bool { return e[first+i].b >= x }) - 1
				ev.retry = e[p].t + w - now
			}
		}
		if full > 0 && w == maxw {
			fits = false
			ev.retry = max(ev.retry, full)
		}
		evs[j] = ev
	}
	return fits
}

// logRecord is log_record in format 2. It returns the key's TTL in ms, or
// 0 to leave it: the first admission in each span of an eighth of the
// longest window sets it to the window, the span and a second.
func logRecord(l *logState, wins []Win, evs []winEval, now, cost int64) int64 {
	at := now
	e := l.live()
	newest, hasNew := int64(0), len(e) > 0
	if hasNew {
		newest = e[len(e)-1].t
		at = max(at, newest)
	}
	var maxw int64
	for j := range wins {
		maxw = max(maxw, wins[j].Len)
	}
	l.entries = append(l.entries, logEntry{t: at, b: l.total})
	l.total += cost
	for j := range wins {
		if evs[j].count == 0 {
			evs[j].reset = at + wins[j].Len - now
		}
		evs[j].count += cost
	}
	span := max(maxw/8, 1)
	if hasNew && floorDiv(at, span) == floorDiv(newest, span) {
		return 0
	}
	return (maxw+span+999)/1000 + 1000
}

// floorDiv is a / b rounded down (b > 0), as Lua's math.floor(a / b).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
