package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// Override is a temporary change of one identity's limits. It is kept in
// the store, in the identity's hash slot, with a TTL, so it ends by itself;
// the script reads it in the same atomic step as the windows. Only the
// requests of identities a node knows to have an override read it (see
// overrideTags): a node learns of one from the notice SetOverride sends
// (milliseconds), and at the latest from the limiter's index of overrides,
// which it reads every OverrideRefresh.
type Override struct {
	// Region, for a limiter with regions, confines the override to the
	// identity's bucket in that region (it wins over an override of every
	// region there); "" applies it in every region and to the global
	// ceiling.
	Region string
	// Factor multiplies every limit (rounded down, at least 1). Either a
	// Factor or Limits and GlobalLimits.
	Factor float64
	// Limits replace the limits of the bucket's windows, in order;
	// GlobalLimits those of the global ceiling (for Region "" only). A
	// token bucket's burst follows its limit in proportion.
	Limits, GlobalLimits []int64
	// TTL is how long it lasts: when set, its duration; when read, what is
	// left of it.
	TTL time.Duration
}

// OverrideEntry is one live override in a limiter's index: the identity
// and region as they stand in keys (a long or unusual value is a hash), and
// the identity's KeyHash.
type OverrideEntry struct {
	Identity, Region, KeyHash string
	Left                      time.Duration
}

// KeyHash names an identity where the identity itself is not shown (it is
// often a secret): the first 12 hex digits of its SHA-256, e.g.
// `printf %s "$KEY" | sha256sum | cut -c1-12`.
func KeyHash(identity string) string {
	d := KeyDigest(identity)
	return hex.EncodeToString(d[:])
}

// KeyDigest is the 6 bytes KeyHash writes in hex.
func KeyDigest(identity string) [6]byte {
	sum := sha256.Sum256([]byte(identity))
	return [6]byte(sum[:6])
}

// MaxOverrideTTL bounds an override's duration: a longer change belongs in
// the configuration.
const MaxOverrideTTL = 90 * 24 * time.Hour

// maxFactor bounds an override's factor.
const maxFactor = 1e6

// OverrideRefresh is how often a node reads the index of live overrides
// (a node that missed a notice learns of an override this late at most).
const OverrideRefresh = 5 * time.Second

// overrideNotice marks a notice about an identity's override.
const overrideNotice = "override"

// overrideTags are the identities (their hash tags) this node knows may
// have a live override. Only their requests carry the overrides key: the
// others do not pay a read per check, and do not declare a key that does
// not exist (on a Redis Cluster slot being migrated, a script whose keys
// are partly missing fails with TRYAGAIN).
type overrideTags struct {
	n     atomic.Int64 // len(m), read without the lock on every request
	clock atomic.Int64 // the order of marks and index reads (tick)
	mu    sync.RWMutex
	m     map[string]int64 // tag → when it was learnt (tick)
}

// tick is a point in the order of marks and index reads: strictly after
// every earlier one (the wall clock may step back).
func (o *overrideTags) tick() int64 { return o.clock.Add(1) }

func (o *overrideTags) has(tag string) bool {
	o.mu.RLock()
	_, ok := o.m[tag]
	o.mu.RUnlock()
	return ok
}

func (o *overrideTags) add(tag string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]int64{}
	}
	o.m[tag] = o.tick()
	o.n.Store(int64(len(o.m)))
}

// replace sets the tags to those of the index read since the given time,
// keeping the ones learnt after it (a notice the read may predate). It
// returns the tags it dropped: known before, gone from the index.
func (o *overrideTags) replace(tags []string, since int64) (dropped []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]int64, len(tags))
	for _, t := range tags {
		m[t] = since
	}
	for t, at := range o.m {
		if at > since {
			m[t] = at
		} else if _, ok := m[t]; !ok {
			dropped = append(dropped, t)
		}
	}
	o.m = m
	o.n.Store(int64(len(m)))
	return dropped
}

// watchOverrides reads the index of live overrides at once, every
// OverrideRefresh, and when kicked, until Close.
func (l *Limiter) watchOverrides() {
	defer close(l.ovDone)
	t := time.NewTicker(OverrideRefresh)
	defer t.Stop()
	for {
		l.readIndex()
		select {
		case <-l.ovStop:
			return
		case <-t.C:
		case <-l.ovKick:
		}
	}
}

// readIndex reads the index of live overrides once. The cached denials of
// identities whose overrides changed since the last read are dropped: they
// were decided under other limits (the notice that drops them may never
// have come).
func (l *Limiter) readIndex() {
	since := l.ov.tick()
	ctx, cancel := context.WithTimeout(context.Background(), OverrideRefresh)
	defer cancel()
	prev := l.ovView.Load()
	list, err := l.ActiveOverrides(ctx)
	if err != nil {
		l.ovView.Store(nil) // unknown until the store answers
		return
	}
	tags := make([]string, len(list))
	for i, e := range list {
		tags[i] = e.Identity
	}
	dropped := l.ov.replace(tags, since)
	if cur := l.ovView.Load(); l.cache != nil && cur != nil {
		changed := changedTags(prev, cur)
		// An identity this node learnt of by a notice after its last
		// read, whose override is gone by this one (deleted, or ended,
		// and the notice of that missed), is not in either read: its
		// denials cached under the override are dropped too.
		for _, t := range dropped {
			changed[t] = true
		}
		if len(changed) > 0 {
			l.cache.forgetTags(changed)
		}
	}
}

// kickOverrides asks watchOverrides to read the index now.
func (l *Limiter) kickOverrides() {
	if l.ovKick != nil {
		select {
		case l.ovKick <- struct{}{}:
		default:
		}
	}
}

// indexView is the index of live overrides as last read: each member's
// end on the store's clock, and that clock's offset from the limiter's.
type indexView struct {
	ends   map[string]int64
	offset int64 // store now − limiter now, µs
}

// see records an index read that returned m at the store's now.
func (l *Limiter) see(m map[string]int64, storeNow int64) {
	l.ovView.Store(&indexView{ends: m, offset: storeNow - l.p.Now().UnixMicro()})
}

// changedTags are the identities whose overrides differ between two reads
// of the index (set, ended early, or set again; all of them when the
// earlier read is unknown).
func changedTags(prev, cur *indexView) map[string]bool {
	out := map[string]bool{}
	tag := func(member string) string { t, _, _ := strings.Cut(member, ":"); return t }
	for m, u := range cur.ends {
		if prev == nil || prev.ends[m] != u {
			out[tag(m)] = true
		}
	}
	if prev != nil {
		for m := range prev.ends {
			if _, ok := cur.ends[m]; !ok {
				out[tag(m)] = true
			}
		}
	}
	return out
}

// OverridesActive is the number of live overrides as of the last read of
// the index (at most OverrideRefresh ago, or this node's last change), with
// those that have ended since left out; ok is false when the last read
// failed. It does no I/O with a remote store: a scrape can call it.
func (l *Limiter) OverridesActive(ctx context.Context) (n int, ok bool) {
	if !l.b.Remote {
		list, err := l.ActiveOverrides(ctx)
		return len(list), err == nil
	}
	v := l.ovView.Load()
	if v == nil {
		return 0, false
	}
	now := l.p.Now().UnixMicro() + v.offset
	for _, u := range v.ends {
		if u > now {
			n++
		}
	}
	return n, true
}

// KnowsOverride reports whether this node's requests of identity read its
// overrides (it has learnt that identity may have one).
func (l *Limiter) KnowsOverride(identity string) bool { return l.ov.has(Tag(identity)) }

// ErrNoOverrides is returned by a Limiter whose store keeps no overrides.
var ErrNoOverrides = errors.New("this store keeps no overrides")

// overrider is a store that keeps overrides: MemoryStore and RedisStore.
// now is the caller's clock in µs, or 0 for the store's.
type overrider interface {
	// overrideSet replaces scope's override by fields (suffix, value
	// pairs) for ttl µs and returns when it ends.
	overrideSet(ctx context.Context, key, scope string, now, ttl int64, fields []string) (until int64, err error)
	// overrideDel ends scope's override; it reports whether one was live.
	overrideDel(ctx context.Context, key, scope string, now int64) (bool, error)
	// overrideGet returns the live fields and the store's now.
	overrideGet(ctx context.Context, key string, now int64) (map[string]string, int64, error)
	// overrideIndex adds member until (> 0), removes it (0) or neither
	// (-1), and returns the live members with their ends, and the store's
	// now.
	overrideIndex(ctx context.Context, index, member string, now, until int64) (map[string]int64, int64, error)
}

// fieldScope splits an override field into its scope and suffix.
func fieldScope(field string) (scope, suffix string, ok bool) {
	i := strings.LastIndexByte(field, '|')
	if i < 0 {
		return "", "", false
	}
	return field[:i], field[i+1:], true
}

// luaNumber reads a number as Lua's tonumber does for the values this
// package writes; ok is false where tonumber gives nil.
func luaNumber(s string) (float64, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return f, err == nil
}

// applyOverride is decide.lua's override: it changes op's limits and
// bursts as the live override in f says, and reports whether a limit
// changed, and when the first override that changed one ends (µs). op's
// parts and windows must be the caller's own copy.
func applyOverride(f map[string]string, op *Op, now int64) (changed bool, ends int64) {
	if len(f) == 0 {
		return false, 0
	}
	active := func(sc string) bool {
		u, ok := luaNumber(f[sc+"|u"])
		return ok && u > float64(now)
	}
	all := active("")
	scope := op.Override.Scope
	for pi := range op.Parts {
		p := &op.Parts[pi]
		var sc string
		switch {
		case !p.Global && scope != "" && active(scope):
			sc = scope
		case all:
			sc = ""
		default:
			continue
		}
		fac, hasFac := luaNumber(f[sc+"|f"])
		pre := sc + "|l"
		if p.Global {
			pre = sc + "|g"
		}
		for j := range p.Windows {
			w := &p.Windows[j]
			old := float64(w.Limit)
			lim, ok := luaNumber(f[pre+w.Name])
			if !ok && hasFac {
				lim, ok = math.Floor(old*fac), true
			}
			if !ok {
				continue
			}
			lim = math.Min(math.Max(lim, 1), MaxValue)
			if lim == old {
				continue
			}
			if p.Kind == KindToken && w.Burst > 0 {
				w.Burst = int64(math.Min(math.Max(math.Floor(float64(w.Burst)*lim/old), 1), MaxValue))
			}
			w.Limit = int64(lim)
			changed = true
			if u, _ := luaNumber(f[sc+"|u"]); ends == 0 || int64(u) < ends {
				ends = int64(u)
			}
		}
	}
	return changed, ends
}

// overriddenCopy returns a copy of op whose windows may be changed.
func overriddenCopy(op *Op) *Op {
	c := *op
	c.Parts = append([]Part(nil), op.Parts...)
	for i := range c.Parts {
		c.Parts[i].Windows = append([]Win(nil), op.Parts[i].Windows...)
	}
	return &c
}

// tooLarge reports whether op's cost is above a window's capacity.
func tooLarge(op *Op) bool {
	for i := range op.Parts {
		p := &op.Parts[i]
		for j := range p.Windows {
			w := &p.Windows[j]
			capacity := w.Limit
			if p.Kind == KindToken && w.Burst > 0 {
				capacity = w.Burst
			}
			if op.Cost > capacity {
				return true
			}
		}
	}
	return false
}

// limitsOf lists op's windows' limits and bursts, as a reply carries them.
func limitsOf(op *Op) (limits, bursts []int64) {
	for i := range op.Parts {
		p := &op.Parts[i]
		for j := range p.Windows {
			b := int64(0)
			if p.Kind == KindToken {
				b = p.Windows[j].Burst
			}
			limits, bursts = append(limits, p.Windows[j].Limit), append(bursts, b)
		}
	}
	return limits, bursts
}

// overrideKey is the key of identity's overrides.
func (l *Limiter) overrideKey(identity string) string {
	return l.keys.Key("override", identity, false, "")
}

// overrideIndex is the key of the limiter's index of live overrides.
func (l *Limiter) overrideIndex() string { return l.keys.Namespace() + "overrides" }

// scopeOf is region as an override's scope ("" for every region).
func (l *Limiter) scopeOf(region string) string {
	if !l.p.Regions || region == "" {
		return ""
	}
	return safePart(region)
}

// storeNow is the clock an override call carries: the caller's with an
// application clock or an in-process store, else 0 (the store's).
func (l *Limiter) storeNow() int64 {
	if l.p.AppClock || !l.b.Remote {
		return l.p.Now().UnixMicro()
	}
	return 0
}

func (l *Limiter) overrider() (overrider, error) {
	o, ok := l.b.Base.(overrider)
	if !ok {
		return nil, ErrNoOverrides
	}
	return o, nil
}

// checkOverride checks o against the policy and returns its fields.
func (l *Limiter) checkOverride(o *Override) ([]string, error) {
	if o.TTL < time.Second || o.TTL > MaxOverrideTTL {
		return nil, fmt.Errorf("%w: an override lasts 1s to %s, not %s", ErrInput, MaxOverrideTTL, o.TTL)
	}
	if o.Region != "" && !l.p.Regions {
		return nil, fmt.Errorf("%w: limiter %q has no regions", ErrInput, l.p.Name)
	}
	hasLimits := len(o.Limits) > 0 || len(o.GlobalLimits) > 0
	switch {
	case o.Factor != 0 && hasLimits:
		return nil, fmt.Errorf("%w: an override has a factor or limits, not both", ErrInput)
	case o.Factor != 0:
		if !(o.Factor > 0 && o.Factor <= maxFactor) {
			return nil, fmt.Errorf("%w: factor %g is not in (0, %g]", ErrInput, o.Factor, float64(maxFactor))
		}
		return []string{"f", strconv.FormatFloat(o.Factor, 'g', -1, 64)}, nil
	case !hasLimits:
		return nil, fmt.Errorf("%w: an override needs a factor or limits", ErrInput)
	}
	if len(o.Limits) > 0 && len(o.Limits) != len(l.p.Windows) {
		return nil, fmt.Errorf("%w: %d limits for %d windows", ErrInput, len(o.Limits), len(l.p.Windows))
	}
	if len(o.GlobalLimits) > 0 {
		if o.Region != "" {
			return nil, fmt.Errorf("%w: the global ceiling is the identity's in every region: an override of one region cannot change it", ErrInput)
		}
		if len(o.GlobalLimits) != len(l.p.GlobalWindows) {
			return nil, fmt.Errorf("%w: %d global limits for %d global windows", ErrInput, len(o.GlobalLimits), len(l.p.GlobalWindows))
		}
	}
	var fields []string
	for gi, ls := range [][]int64{o.Limits, o.GlobalLimits} {
		ws, pre := l.p.Windows, "l"
		if gi == 1 {
			ws, pre = l.p.GlobalWindows, "g"
		}
		for i, v := range ls {
			if v <= 0 || v > MaxValue {
				return nil, fmt.Errorf("%w: limit %d is not in 1..2^50", ErrInput, v)
			}
			fields = append(fields, pre+winName(ws[i]), strconv.FormatInt(v, 10))
		}
	}
	return fields, nil
}

// winName is the name a window's state and override fields go by.
func winName(w Window) string {
	if w.Period != PeriodNone {
		return w.Period.String()
	}
	return WindowName(w.Duration)
}

// SetOverride sets identity's override (replacing the one of the same
// region) and returns it as stored, with TTL what is left. Every node
// applies it on the identity's next request: the store holds it, and a
// notice drops the identity's cached denials on every node.
func (l *Limiter) SetOverride(ctx context.Context, identity string, o Override) (Override, error) {
	fields, err := l.checkOverride(&o)
	if err != nil {
		return Override{}, err
	}
	st, err := l.overrider()
	if err != nil {
		return Override{}, err
	}
	scope := l.scopeOf(o.Region)
	until, err := st.overrideSet(ctx, l.overrideKey(identity), scope, l.storeNow(), o.TTL.Microseconds(), fields)
	if err != nil {
		return Override{}, err
	}
	l.ov.add(Tag(identity))
	m, now, err := st.overrideIndex(ctx, l.overrideIndex(), indexMember(identity, scope), l.storeNow(), until)
	if err != nil {
		return Override{}, err
	}
	// Marked again once the index holds it: a read of the index that began
	// after the first mark and read it before the member was written
	// (this node's watcher, its first read late under load) drops the
	// identity as learnt before it and gone from the index; this mark is
	// later than that read began, and survives it (TestSetOverrideSurvivesAnIndexReadAmidIt).
	l.ov.add(Tag(identity))
	l.see(m, now)
	l.tell(ctx, identity)
	got, err := l.Overrides(ctx, identity)
	if err != nil {
		return Override{}, err
	}
	for _, g := range got {
		if l.scopeOf(g.Region) == scope {
			return g, nil
		}
	}
	return Override{}, fmt.Errorf("the override of %q ended as it was set (ttl %s)", identity, o.TTL)
}

// DeleteOverride ends identity's override in region ("" the one of every
// region) early; it reports whether one was live.
func (l *Limiter) DeleteOverride(ctx context.Context, identity, region string) (bool, error) {
	if region != "" && !l.p.Regions {
		return false, fmt.Errorf("%w: limiter %q has no regions", ErrInput, l.p.Name)
	}
	st, err := l.overrider()
	if err != nil {
		return false, err
	}
	scope := l.scopeOf(region)
	had, err := st.overrideDel(ctx, l.overrideKey(identity), scope, l.storeNow())
	if err != nil {
		return false, err
	}
	m, now, err := st.overrideIndex(ctx, l.overrideIndex(), indexMember(identity, scope), l.storeNow(), 0)
	if err != nil {
		return had, err
	}
	l.see(m, now)
	l.tell(ctx, identity)
	return had, nil
}

// Overrides returns identity's live overrides, the one of every region
// first, with TTL what is left of each.
func (l *Limiter) Overrides(ctx context.Context, identity string) ([]Override, error) {
	st, err := l.overrider()
	if err != nil {
		return nil, err
	}
	f, now, err := st.overrideGet(ctx, l.overrideKey(identity), l.storeNow())
	if err != nil {
		return nil, err
	}
	byScope := map[string]*Override{}
	var scopes []string
	for field, v := range f {
		sc, suffix, ok := fieldScope(field)
		if !ok {
			continue
		}
		o := byScope[sc]
		if o == nil {
			o = &Override{Region: sc}
			byScope[sc] = o
			scopes = append(scopes, sc)
		}
		switch {
		case suffix == "u":
			if u, err := strconv.ParseInt(v, 10, 64); err == nil {
				o.TTL = time.Duration(u-now) * time.Microsecond
			}
		case suffix == "f":
			o.Factor, _ = strconv.ParseFloat(v, 64)
		case len(suffix) > 1 && (suffix[0] == 'l' || suffix[0] == 'g'):
			n, _ := strconv.ParseInt(v, 10, 64)
			ws, dst := l.p.Windows, &o.Limits
			if suffix[0] == 'g' {
				ws, dst = l.p.GlobalWindows, &o.GlobalLimits
			}
			if *dst == nil {
				*dst = make([]int64, len(ws))
			}
			for i, w := range ws {
				if winName(w) == suffix[1:] {
					(*dst)[i] = n
				}
			}
		}
	}
	sort.Strings(scopes)
	out := make([]Override, 0, len(scopes))
	for _, sc := range scopes {
		if byScope[sc].TTL > 0 {
			out = append(out, *byScope[sc])
		}
	}
	return out, nil
}

// ActiveOverrides lists the limiter's live overrides, soonest to end
// first.
func (l *Limiter) ActiveOverrides(ctx context.Context) ([]OverrideEntry, error) {
	st, err := l.overrider()
	if err != nil {
		return nil, err
	}
	m, now, err := st.overrideIndex(ctx, l.overrideIndex(), "", l.storeNow(), -1)
	if err != nil {
		return nil, err
	}
	l.see(m, now)
	out := make([]OverrideEntry, 0, len(m))
	for member, until := range m {
		if until <= now {
			continue
		}
		f := strings.SplitN(member, ":", 3)
		for len(f) < 3 {
			f = append(f, "")
		}
		out = append(out, OverrideEntry{Identity: f[0], Region: f[1], KeyHash: f[2], Left: time.Duration(until-now) * time.Microsecond})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Left != out[j].Left {
			return out[i].Left < out[j].Left
		}
		return out[i].Identity+":"+out[i].Region < out[j].Identity+":"+out[j].Region
	})
	return out, nil
}

// indexMember names an override in the index: the identity's tag, its
// scope and the identity's KeyHash, separated by ':' (tags and scopes hold
// none).
func indexMember(identity, scope string) string {
	return Tag(identity) + ":" + scope + ":" + KeyHash(identity)
}

// tell drops identity's cached denials here and, through the notifier, on
// every node (an override changes what they would decide), and tells every
// node that identity's requests must read its overrides.
func (l *Limiter) tell(ctx context.Context, identity string) {
	if l.cache != nil {
		l.cache.Forget(Tag(identity))
	}
	if l.b.Notifier != nil {
		_ = l.b.Notifier.Publish(ctx, l.channel, l.keys.Namespace()+"\n"+Tag(identity)+"\n"+overrideNotice)
	}
}

// overrideScript is override.lua.
var overrideScript = redis.NewScript(lua.Override)

func (s *RedisStore) overrideSet(ctx context.Context, key, scope string, now, ttl int64, fields []string) (int64, error) {
	args := []any{"set", now, scope, ttl}
	for _, f := range fields {
		args = append(args, f)
	}
	return overrideScript.Run(ctx, s.client, []string{key}, args...).Int64()
}

func (s *RedisStore) overrideDel(ctx context.Context, key, scope string, now int64) (bool, error) {
	n, err := overrideScript.Run(ctx, s.client, []string{key}, "del", now, scope).Int64()
	return n == 1, err
}

func (s *RedisStore) overrideGet(ctx context.Context, key string, now int64) (map[string]string, int64, error) {
	v, err := overrideScript.Run(ctx, s.client, []string{key}, "get", now).Slice()
	f := map[string]string{}
	t, err := readPairs(v, err, func(k string, x any) bool {
		s, ok := x.(string)
		f[k] = s
		return ok
	})
	return f, t, err
}

func (s *RedisStore) overrideIndex(ctx context.Context, index, member string, now, until int64) (map[string]int64, int64, error) {
	v, err := overrideScript.Run(ctx, s.client, []string{index}, "index", now, member, until).Slice()
	m := map[string]int64{}
	t, err := readPairs(v, err, func(k string, x any) bool {
		u, ok := x.(int64)
		m[k] = u
		return ok
	})
	return m, t, err
}

// readPairs reads override.lua's {now, name, value, ...} replies: now, and
// each pair through add, which reports whether the value has its type.
func readPairs(v []any, err error, add func(name string, value any) bool) (int64, error) {
	if err != nil {
		return 0, err
	}
	if len(v)%2 != 1 {
		return 0, fmt.Errorf("%w: %d values", ErrBadReply, len(v))
	}
	t, ok := v[0].(int64)
	if !ok {
		return 0, fmt.Errorf("%w: now is %T", ErrBadReply, v[0])
	}
	for i := 1; i < len(v); i += 2 {
		k, ok := v[i].(string)
		if !ok || !add(k, v[i+1]) {
			return 0, fmt.Errorf("%w: name %T, value %T", ErrBadReply, v[i], v[i+1])
		}
	}
	return t, nil
}

// The in-process store keeps overrides as override.lua does, in memKey.ov
// (the hash) and memKey.idx (the index).

func (s *MemoryStore) clockOr(now int64) int64 {
	if now == 0 {
		return s.now().UnixMicro()
	}
	return now
}

// liveScopes returns the ends of f's scopes.
func liveScopes(f map[string]string) map[string]int64 {
	u := map[string]int64{}
	for field, v := range f {
		if sc, suffix, ok := fieldScope(field); ok && suffix == "u" {
			u[sc], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return u
}

func (s *MemoryStore) overrideSet(_ context.Context, key, scope string, now, ttl int64, fields []string) (int64, error) {
	now = s.clockOr(now)
	until := now + ttl
	s.overrideEdit(key, scope, now, func(f map[string]string) {
		f[scope+"|u"] = strconv.FormatInt(until, 10)
		for i := 0; i+1 < len(fields); i += 2 {
			f[scope+"|"+fields[i]] = fields[i+1]
		}
	})
	return until, nil
}

func (s *MemoryStore) overrideDel(_ context.Context, key, scope string, now int64) (bool, error) {
	return s.overrideEdit(key, scope, s.clockOr(now), func(map[string]string) {}), nil
}

func (s *MemoryStore) overrideGet(_ context.Context, key string, now int64) (map[string]string, int64, error) {
	now = s.clockOr(now)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := map[string]string{}
	k := sh.get(key, s.wallNow())
	if k == nil {
		return out, now, nil
	}
	ends := liveScopes(k.ov)
	for field, v := range k.ov {
		if sc, _, ok := fieldScope(field); ok && ends[sc] > now {
			out[field] = v
		}
	}
	return out, now, nil
}

func (s *MemoryStore) overrideIndex(_ context.Context, index, member string, now, until int64) (map[string]int64, int64, error) {
	now = s.clockOr(now)
	sh := s.shard(index)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	wall := s.wallNow()
	k := sh.get(index, wall)
	if k == nil {
		k = &memKey{idx: map[string]int64{}}
	}
	for m, u := range k.idx {
		if u <= now {
			delete(k.idx, m)
		}
	}
	switch {
	case until > 0:
		k.idx[member] = until
	case until == 0:
		delete(k.idx, member)
	}
	out := make(map[string]int64, len(k.idx))
	var last int64
	for m, u := range k.idx {
		out[m] = u
		last = max(last, u)
	}
	if until >= 0 {
		if last <= now {
			delete(sh.m, index)
		} else {
			expire(k, (last-now+999)/1000+1000, wall)
			s.put(sh, index, k)
		}
	}
	return out, now, nil
}

// overrideEdit drops scope's fields and the expired ones, lets edit add
// fields, and sets the key's TTL to its last live end.
func (s *MemoryStore) overrideEdit(key, scope string, now int64, edit func(map[string]string)) (had bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	wall := s.wallNow()
	k := sh.get(key, wall)
	f := map[string]string{}
	if k != nil && k.ov != nil {
		f = k.ov
	}
	ends := liveScopes(f)
	had = ends[scope] > now
	for field := range f {
		sc, _, ok := fieldScope(field)
		if !ok || sc == scope || ends[sc] <= now {
			delete(f, field)
		}
	}
	edit(f)
	var last int64
	for _, u := range liveScopes(f) {
		if u > now && u > last {
			last = u
		}
	}
	if last <= now {
		delete(sh.m, key)
		return had
	}
	if k == nil {
		k = &memKey{}
	}
	k.ov = f
	expire(k, (last-now+999)/1000+1000, wall)
	s.put(sh, key, k)
	return had
}
