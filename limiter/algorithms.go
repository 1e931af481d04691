package limiter

import "math"

// The in-process twins of lua/sliding_counter.lua, lua/fixed_window.lua and
// lua/token_bucket.lua. Redis runs Lua with IEEE doubles, so these functions
// compute in float64 and repeat the scripts' arithmetic operation by
// operation, in the same order, with the same floor/ceil: the two stores give
// bit-identical answers. Products are wrapped in explicit float64 conversions
// so the compiler cannot fuse them into an FMA (Lua rounds every operation).
// Read them side by side with the scripts; the comments there explain why.

// counterKey is one sliding_counter key rolled to the request's window:
// window idx holds cur units, window idx-1 prev units; base is the time the
// estimate is taken at (now, or the start of a stored window that is ahead
// of now).
type counterKey struct {
	window, idx, base, cur, prev, est float64
}

// estimateAt is estimate_at in sliding_counter.lua.
func (c *counterKey) estimateAt(t float64) float64 {
	w := c.window
	k := math.Floor(t / w)
	if k == c.idx {
		return float64(c.prev*(w-(t-float64(c.idx*w))))/w + c.cur
	}
	if k == c.idx+1 {
		return float64(c.cur*(w-(t-float64(k*w)))) / w
	}
	return 0
}

// timeUntil is time_until in sliding_counter.lua: the smallest whole d >= 0
// (µs) with estimateAt(base + d) <= target.
func (c *counterKey) timeUntil(target float64) float64 {
	if c.estimateAt(c.base) <= target {
		return 0
	}
	w := c.window
	e := c.base - float64(c.idx*w)
	var d float64
	if target >= c.cur && c.prev > 0 {
		d = math.Ceil(w - float64((target-c.cur)*w)/c.prev - e)
	} else {
		x := 0.0
		if c.cur > 0 {
			x = w - float64(target*w)/c.cur
			if x < 0 {
				x = 0
			}
		}
		d = math.Ceil(w - e + x)
	}
	if d < 1 {
		d = 1
	}
	for n := 0; n < 4 && c.estimateAt(c.base+d) > target; n++ {
		d = d + 1
	}
	for n := 0; n < 4 && d > 1 && c.estimateAt(c.base+d-1) <= target; n++ {
		d = d - 1
	}
	return d
}

func checkCounter(st *memState, now, window, cost, limit int64) keyEval {
	fnow, w, fcost, flimit := float64(now), float64(window), float64(cost), float64(limit)
	c := counterKey{window: w, idx: math.Floor(fnow / w), base: fnow}
	if st != nil {
		sw := float64(st.win)
		switch {
		case sw == c.idx:
			c.cur, c.prev = float64(st.cur), float64(st.prev)
		case sw == c.idx-1:
			c.prev = float64(st.cur)
		case sw > c.idx:
			c.idx, c.base = sw, float64(sw*w)
			c.cur, c.prev = float64(st.cur), float64(st.prev)
		}
	}
	c.est = c.estimateAt(c.base)
	count := math.Ceil(c.est)
	if count > c.cur+c.prev {
		count = c.cur + c.prev
	}
	if count < 0 {
		count = 0
	}
	retry := 0.0
	if fcost > flimit {
		retry = w
	} else if c.est > flimit-fcost {
		retry = c.timeUntil(flimit-fcost) + (c.base - fnow)
	}
	return keyEval{rawUsage: rawUsage{count: int64(count), retry: int64(retry)}, counter: c}
}

func recordCounter(st *memState, ev *keyEval, now, window, cost int64) {
	c := &ev.counter
	c.cur = c.cur + float64(cost)
	ev.count += cost
	c.est = c.estimateAt(c.base)
	st.win, st.cur, st.prev = int64(c.idx), int64(c.cur), int64(c.prev)
	st.expires = now + int64(math.Ceil(2*float64(window)/1000)+1000)*1000
}

// counterReset fills reset_us, which the script computes after any write.
func (ev *keyEval) counterReset(now int64) {
	c := &ev.counter
	if c.est > 0 {
		target := c.est - 1
		if target < 0 {
			target = 0
		}
		ev.reset = int64(c.timeUntil(target) + (c.base - float64(now)))
	}
}

func checkFixed(st *memState, now, window, cost, limit int64) keyEval {
	fnow, w := float64(now), float64(window)
	idx := math.Floor(fnow / w)
	count := 0.0
	if st != nil {
		sw := float64(st.win)
		if sw == idx {
			count = float64(st.cur)
		} else if sw > idx {
			idx, count = sw, float64(st.cur)
		}
	}
	wend := float64((idx + 1) * w)
	var u rawUsage
	u.count = int64(count)
	if count > 0 {
		u.reset = int64(wend - fnow)
	}
	if count+float64(cost) > float64(limit) {
		if cost > limit {
			u.retry = window
		} else {
			u.retry = int64(wend - fnow)
		}
	}
	return keyEval{rawUsage: u, win: idx, end: wend}
}

func recordFixed(st *memState, ev *keyEval, now, cost int64) {
	fnow := float64(now)
	ev.count += cost
	ev.reset = int64(ev.end - fnow)
	st.win, st.cur = int64(ev.win), ev.count
	st.expires = now + int64(math.Ceil((ev.end-fnow)/1000)+1000)*1000
}

// tokensInUse is in_use in token_bucket.lua.
func tokensInUse(d, burst, interval float64) float64 {
	remaining := math.Floor((float64(burst*interval) - d) / interval)
	if remaining < 0 {
		remaining = 0
	} else if remaining > burst {
		remaining = burst
	}
	return burst - remaining
}

func checkToken(st *memState, now, window, cost, limit, burstArg int64) keyEval {
	fnow, w, fcost, flimit := float64(now), float64(window), float64(cost), float64(limit)
	burst := float64(burstArg)
	if burst <= 0 {
		burst = flimit
	}
	interval := math.Floor(w/flimit + 0.5)
	if interval < 1 {
		interval = 1
	}
	d := 0.0
	if st != nil {
		d = float64(st.tat) - fnow
		if d < 0 {
			d = 0
		}
	}
	retry := 0.0
	if fcost > burst {
		retry = w
	} else {
		allowAt := d + float64(interval*fcost) - float64(burst*interval)
		if allowAt > 0 {
			retry = allowAt
		}
	}
	return keyEval{
		rawUsage: rawUsage{count: int64(tokensInUse(d, burst, interval)), retry: int64(retry), reset: int64(d)},
		burst:    burst, interval: interval, d: d,
	}
}

func recordToken(st *memState, ev *keyEval, now, cost int64) {
	d := ev.d + float64(ev.interval*float64(cost))
	ev.count = int64(tokensInUse(d, ev.burst, ev.interval))
	ev.reset = int64(d)
	st.tat = int64(float64(now) + d)
	st.expires = now + int64(math.Ceil(d/1000)+1000)*1000
}
