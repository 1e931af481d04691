package limiter

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter/dc"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// The shares of a global ceiling kept in a ledger (global_redis) in each
// store: the checks of a share part (KindShare) and dc.ShareStore. What a
// share is, and its types, are limiter/dc's (dc/share.go).

// ---- the in-process store ------------------------------------------------

// shareState is a share in the in-process store.
type shareState struct {
	g          [dc.Slots]ShareGrant
	has        [dc.Slots]bool
	full       int64 // f
	next       int64 // k
	claim      int64 // c
	dw, dc, dp int64 // the demand, per second
	sig        string
	counts     []int64 // G
	inc        string  // r: the incarnation (ShareView.Inc), set by ShareBegin
}

// under is the share as checks under the limits of signature sig see it:
// grants (and what the ledger said of them) under other limits are not
// there.
// A deposit adopts sig (the ledger answered under it); a check does not,
// as the script writes "L" only in a deposit.
func (st *shareState) under(sig string, adopt bool) {
	if st.sig != sig {
		st.g, st.has, st.full, st.counts, st.next = [dc.Slots]ShareGrant{}, [dc.Slots]bool{}, 0, nil, 0
		if adopt {
			st.sig = sig
		}
	}
}

func (st *shareState) held(now int64) (rem, soon, slen int64, closed bool, latest int64) {
	latest = now
	for i := range st.g {
		if !st.has[i] {
			continue
		}
		g := &st.g[i]
		if !g.Closed(now) {
			rem += g.Units - g.Used
			if soon == 0 || g.Deadline < soon {
				soon, slen = g.Deadline, g.Deadline-g.Start
			}
		} else {
			closed = true
		}
		latest = max(latest, g.Deadline)
	}
	return
}

func (st *shareState) rate(now int64) (rate, idx, dc, dp int64) {
	idx = now / 1_000_000
	switch st.dw {
	case idx:
		return max(st.dc, st.dp), idx, st.dc, st.dp
	case idx - 1:
		return st.dc, idx, 0, st.dc
	}
	return 0, idx, 0, 0
}

// count is share_count: window j's count, the ledger's ("G") less rem.
func (st *shareState) count(j int, limit, rem int64) int64 {
	c := limit
	if j < len(st.counts) {
		c = st.counts[j]
	}
	return max(c-rem, 0)
}

// shareCheck is share_check.
func (m *memDo) shareCheck(p *Part, k *memKey, pe []winEval) bool {
	t := m.s.now().UnixMicro()
	st := &shareState{sig: p.Sig}
	fresh := true
	if k != nil && k.share != nil && k.share.sig == p.Sig {
		st, fresh = k.share, false
	}
	rem, soon, _, _, _ := st.held(t)
	fits := rem >= m.op.Cost
	for j := range pe {
		pe[j] = winEval{count: st.count(j, p.Windows[j].Limit, rem)}
		if soon > 0 {
			pe[j].reset = soon - t
		}
		if !fits {
			switch {
			case st.full > t:
				pe[j].retry = st.full - t
			case fresh:
				pe[j].retry = 1
			default:
				pe[j].retry = max(p.Lead, 1000)
			}
		}
	}
	m.shareNew = fresh
	return fits
}

// shareAfter is share_after; it returns the flags.
func (m *memDo) shareAfter(p *Part, key string, k *memKey, pe []winEval, fit, demand, recording bool) ShareFlags {
	t := m.s.now().UnixMicro()
	if k == nil {
		k = &memKey{}
	}
	if k.share == nil {
		k.share = &shareState{}
	}
	st := k.share
	st.under(p.Sig, false)
	cost := m.op.Cost
	rate, idx, dc, dp := st.rate(t)
	write := false
	if demand {
		dc += cost
		st.dw, st.dc, st.dp = idx, dc, dp
		write = true
	}
	rem, _, _, _, _ := st.held(t)
	if recording {
		for left := cost; left > 0; {
			best := -1
			for i := range st.g {
				if st.has[i] && !st.g[i].Closed(t) && (best < 0 || st.g[i].Deadline < st.g[best].Deadline) {
					best = i
				}
			}
			g := &st.g[best]
			take := min(left, g.Units-g.Used)
			g.Used += take
			g.Last = t
			left -= take
		}
		rem -= cost
		for j := range pe {
			pe[j].count = st.count(j, p.Windows[j].Limit, rem)
		}
		write = true
	}
	_, soon, slen, closed, latest := st.held(t)
	var flags ShareFlags
	if !fit {
		flags = ShareShort
		if demand {
			flags |= ShareOnly
			if m.shareNew {
				flags |= ShareAsk
			}
		}
	}
	low := cost + int64(math.Ceil(float64(rate)*float64(p.Lead)/1e6))
	more := demand && (rem < low || soon > 0 && float64(soon-t) < math.Max(float64(p.Lead), float64(slen)/2)) &&
		(st.full-t < p.Lead || st.next > 0 && st.next <= t)
	if st.full > t {
		flags |= ShareFull
	}
	if (flags&ShareAsk != 0 || closed || more) && st.claim <= t {
		st.claim = t + p.Claim
		flags |= ShareRenew
		latest = max(latest, st.claim)
		write = true
	}
	if write {
		expire(k, (max(latest, st.full)-t+999)/1000+60000, m.wall)
		m.s.put(m.sh, key, k)
	}
	return flags
}

// ShareBegin implements ShareStore.
func (s *MemoryStore) ShareBegin(_ context.Context, key, sig string, recall bool) (ShareView, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := s.now().UnixMicro()
	v := ShareView{Now: t}
	wall := s.wallNow()
	k := sh.get(key, wall)
	if k == nil || k.share == nil || k.share.inc == "" {
		// The share's incarnation (lua/dcshare.lua's "r"): a deposit into a
		// share reset after this read changes nothing.
		if k == nil {
			k = &memKey{}
			expire(k, 60000, wall)
		}
		if k.share == nil {
			k.share = &shareState{}
		}
		k.share.inc = strconv.FormatInt(s.incs.Add(1), 10)
		s.put(sh, key, k)
	}
	v.Inc = k.share.inc
	if recall && k.share.sig != sig {
		v.Stale = true
		return v, nil
	}
	v.Rate, _, _, _ = k.share.rate(t)
	for i := range k.share.g {
		if k.share.has[i] && k.share.sig == sig {
			if recall && !k.share.g[i].Closed(t) {
				k.share.g[i].Deadline = t
			}
			v.Grants = append(v.Grants, k.share.g[i])
		}
	}
	return v, nil
}

// ShareDeposit implements ShareStore.
func (s *MemoryStore) ShareDeposit(_ context.Context, key string, d Deposit) (int, error) {
	sh, k, t, wall := s.lockKey(key)
	defer sh.mu.Unlock()
	if k.share == nil || k.share.inc != d.Inc {
		return -1, nil // reset since its renewal read it
	}
	st := k.share
	if d.Only && st.sig != "" && st.sig != d.Sig {
		return 0, nil
	}
	st.under(d.Sig, true)
	free, ended := -1, -1
	latest := t
	for i := range st.g {
		g := &st.g[i]
		if st.has[i] && g.Closed(t) && slices.Contains(d.Returned, g.ID) {
			st.has[i], st.g[i] = false, ShareGrant{}
		}
		switch {
		case !st.has[i]:
			if free < 0 {
				free = i
			}
		default:
			if g.Closed(t) && ended < 0 {
				ended = i
			}
			latest = max(latest, g.Deadline)
		}
	}
	st.claim, st.full, st.next = 0, 0, 0
	if len(d.Counts) > 0 {
		st.counts = append([]int64(nil), d.Counts...)
	}
	if d.Retry > 0 {
		st.full, st.next = t+d.Retry, t+min(d.Retry, d.Recheck)
	}
	slot := 0
	if d.Units > 0 {
		i := free
		if i < 0 {
			i = ended
		}
		if i >= 0 {
			st.g[i] = ShareGrant{Units: d.Units, Deadline: d.T0 + d.Length, Start: d.T0, ID: d.ID}
			st.has[i] = true
			slot = i + 1
			latest = max(latest, d.T0+d.Length)
		}
	}
	expire(k, (max(latest, st.full)-t+999)/1000+60000, wall)
	s.put(sh, key, k)
	return slot, nil
}

// lockKey locks key's shard (the caller unlocks it) and returns its live
// state, new when it has none (the caller puts it), with the store's clock
// (µs) and the wall clock (ns).
func (s *MemoryStore) lockKey(key string) (*memShard, *memKey, int64, int64) {
	sh := s.shard(key)
	sh.mu.Lock()
	wall := s.wallNow()
	k := sh.get(key, wall)
	if k == nil {
		k = &memKey{}
	}
	return sh, k, s.now().UnixMicro(), wall
}

// StandingDo implements ShareStore.
func (s *MemoryStore) StandingDo(_ context.Context, key, op string, arg int64) (Standing, bool, error) {
	sh, k, t, wall := s.lockKey(key)
	defer sh.mu.Unlock()
	if k.standing == nil {
		k.standing = &Standing{}
	}
	st := k.standing
	st.Now = t
	ok := true
	switch op {
	case "send":
		if st.Static {
			return *st, false, nil
		}
		st.Sent = t
	case "static":
		if st.Sent == 0 {
			st.Sent = t
		}
		if !st.Static && t >= st.Sent+arg {
			st.Static, st.Since = true, t
		}
	case "normal":
		st.Static, st.Sent, st.N = false, t, arg
	case "poll":
		if arg > 0 {
			st.N = arg
		}
	default:
		return Standing{}, false, fmt.Errorf("limiter: standing operation %q", op)
	}
	expire(k, 86_400_000, wall)
	s.put(sh, key, k)
	return *st, ok, nil
}

// ---- the Redis store -----------------------------------------------------

var dcshareScript = redis.NewScript(lua.DCShare)

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ShareBegin implements ShareStore.
func (s *RedisStore) ShareBegin(ctx context.Context, key, sig string, recall bool) (ShareView, error) {
	raw, err := dcshareScript.Run(ctx, s.client, []string{key}, "begin", sig, b01(recall)).Slice()
	if err != nil {
		return ShareView{}, err
	}
	n := func(i int) int64 { v, _ := raw[i].(int64); return v }
	if len(raw) == 2 && n(1) == -1 {
		return ShareView{Now: n(0), Stale: true}, nil
	}
	if len(raw) != 3+6*dc.Slots {
		return ShareView{}, fmt.Errorf("%w: share of %d values", ErrBadReply, len(raw))
	}
	v := ShareView{Now: n(0), Rate: n(1)}
	v.Inc, _ = raw[2+6*dc.Slots].(string)
	for i := range dc.Slots {
		o := 2 + 6*i
		if n(o) == 0 {
			continue
		}
		id, _ := raw[o+5].(string)
		v.Grants = append(v.Grants, ShareGrant{Units: n(o), Used: n(o + 1), Deadline: n(o + 2), Start: n(o + 3), Last: n(o + 4), ID: id})
	}
	return v, nil
}

// ShareDeposit implements ShareStore.
func (s *RedisStore) ShareDeposit(ctx context.Context, key string, d Deposit) (int, error) {
	args := []any{"deposit", d.T0, d.Units, d.Length, d.ID, d.Retry, d.Sig, d.Recheck, len(d.Returned)}
	for _, id := range d.Returned {
		args = append(args, id)
	}
	args = append(args, len(d.Counts))
	for _, c := range d.Counts {
		args = append(args, c)
	}
	args = append(args, b01(d.Only), d.Inc)
	slot, err := dcshareScript.Run(ctx, s.client, []string{key}, args...).Int()
	return slot, err
}

// StandingDo implements ShareStore.
func (s *RedisStore) StandingDo(ctx context.Context, key, op string, arg int64) (Standing, bool, error) {
	raw, err := dcshareScript.Run(ctx, s.client, []string{key}, op, arg).Int64Slice()
	if err != nil {
		return Standing{}, false, err
	}
	if op == "send" {
		if len(raw) != 2 {
			return Standing{}, false, fmt.Errorf("%w: send of %d values", ErrBadReply, len(raw))
		}
		return Standing{Now: raw[1]}, raw[0] == 1, nil
	}
	if len(raw) != 5 {
		return Standing{}, false, fmt.Errorf("%w: standing of %d values", ErrBadReply, len(raw))
	}
	return Standing{Static: raw[0] == 1, Since: raw[1], Sent: raw[2], N: raw[3], Now: raw[4]}, true, nil
}
