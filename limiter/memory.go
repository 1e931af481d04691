package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

const memoryShards = 64

// DefaultMemoryKeys bounds the keys of an in-process store by default.
const DefaultMemoryKeys = 1 << 20

// MemoryStore is the in-process store: the same algorithms and the same
// answers as the script, for one Caddy process. Keys of one identity (its
// regions, its global ceiling, its ban and lease) live in one shard, under
// one lock, so an Op is decided over all its keys atomically.
//
// Memory is bounded twice:
//   - by expiry: every key expires as its Redis twin does, on the wall
//     clock (its TTL, refreshed on write), whatever clock the requests
//     carry. A request finds an expired key gone; a janitor expires keys
//     incrementally, sampling a few keys per shard every 100 ms and sampling
//     again while more than a tenth of a sample had expired (Redis's own
//     active expiry), so a sweep never walks every key.
//   - by count: at most maxKeys keys. A new key in a full shard evicts, of
//     8 sampled keys, the one that would expire first (the least recently
//     written), as Redis's volatile-ttl policy does; Evictions counts them.
//     An evicted key's budget starts again: size the bound above the keys
//     live in one window (rate of new identities × the longest window).
//
// Like the script's state, a state carries its own timestamps: expiry only
// reclaims memory, it never changes an answer.
type MemoryStore struct {
	now         func() time.Time
	expiryClock bool // TTLs run on now (WithClock), not on the wall clock
	seed        maphash.Seed
	shards      [memoryShards]memShard
	perShard    int
	evictions   atomic.Int64
	incs        atomic.Int64 // the shares' incarnations (ShareBegin)
	bus         listeners
	stop        chan struct{}
	stopOnce    sync.Once
	done        chan struct{}
}

type memShard struct {
	mu sync.Mutex
	m  map[string]*memKey
}

// memKey is one key: a log, a hash of window states, a ban or a lease set.
type memKey struct {
	wall int64 // ns on the wall clock: when the key expires (its TTL)
	log  logState
	wins []winState
	// ban: until, and the denial count's window index, current and
	// previous counts (hasBan: the fields are set).
	banU, banW, banC, banP int64
	hasBan                 bool
	leases                 map[string]int64 // lease id → expiry (µs)
	// ov: an identity's overrides (field → value, as override.lua keeps
	// them); idx: a limiter's index of them (member → until, µs).
	ov  map[string]string
	idx map[string]int64
	// share: a data centre's share of a global ceiling (share.go);
	// standing: its standing with the ledger.
	share    *shareState
	standing *Standing
}

// MemoryOption configures a MemoryStore.
type MemoryOption func(*MemoryStore)

// WithClock sets the clock used for Ops whose Now is zero, and for expiry:
// a key's TTL then runs on it too, so that a test's clock that stands
// still while real time passes (a stalled call, a reload) does not see a
// key expire early, and one moved past a TTL sees it go.
func WithClock(now func() time.Time) MemoryOption {
	return func(s *MemoryStore) { s.now, s.expiryClock = now, true }
}

// WithMaxKeys bounds the keys held (default DefaultMemoryKeys).
func WithMaxKeys(n int) MemoryOption {
	return func(s *MemoryStore) {
		if n > 0 {
			s.perShard = max(1, n/memoryShards)
		}
	}
}

// NewMemoryStore returns a store and starts its janitor; Close stops it.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	s := &MemoryStore{
		now:      time.Now,
		seed:     maphash.MakeSeed(),
		perShard: DefaultMemoryKeys / memoryShards,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*memKey)
	}
	go s.janitor(100 * time.Millisecond)
	return s
}

// Close stops the janitor. The store must not be used afterwards.
func (s *MemoryStore) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of keys held (expired ones included until the
// janitor or a request drops them).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many live keys were dropped to stay under the bound.
func (s *MemoryStore) Evictions() int64 { return s.evictions.Load() }

// Reset implements Store.
func (s *MemoryStore) Reset(_ context.Context, keys ...string) error {
	for _, k := range keys {
		sh := s.shard(k)
		sh.mu.Lock()
		delete(sh.m, k)
		sh.mu.Unlock()
	}
	return nil
}

func (s *MemoryStore) shard(key string) *memShard {
	tag := HashTag(key)
	if tag == "" {
		tag = key
	}
	return &s.shards[maphash.String(s.seed, tag)%memoryShards]
}

// get returns key's live state (nil when it has none or it has expired, as
// Redis would have dropped it). wall is the wall clock in ns.
func (sh *memShard) get(key string, wall int64) *memKey {
	k := sh.m[key]
	if k != nil && k.wall <= wall {
		delete(sh.m, key)
		return nil
	}
	return k
}

// put stores k under key if it is new, evicting to stay under the bound.
func (s *MemoryStore) put(sh *memShard, key string, k *memKey) {
	if _, ok := sh.m[key]; ok {
		return
	}
	if len(sh.m) >= s.perShard {
		victim, soonest := "", int64(math.MaxInt64)
		n := 0
		for vk, v := range sh.m {
			if v.wall < soonest && HashTag(vk) != HashTag(key) {
				victim, soonest = vk, v.wall
			}
			if n++; n == 8 {
				break
			}
		}
		if victim != "" {
			delete(sh.m, victim)
			s.evictions.Add(1)
		}
	}
	sh.m[key] = k
}

// wallNow is the time TTLs run on (ns): the wall clock, or the clock
// WithClock gave.
func (s *MemoryStore) wallNow() int64 {
	if s.expiryClock {
		return s.now().UnixNano()
	}
	return time.Now().UnixNano()
}

// expire sets k's time to live.
func expire(k *memKey, ttlMS int64, wall int64) {
	k.wall = wall + ttlMS*int64(time.Millisecond)
}

// Do implements Store: decide.lua's decide, for one Op.
func (s *MemoryStore) Do(_ context.Context, op *Op) (Reply, error) {
	if err := op.validate(); err != nil {
		return Reply{}, err
	}
	now := op.Now
	if now == 0 {
		now = s.now().UnixMicro()
	}
	var tagKey string
	if op.Mode == ModeRelease {
		tagKey = op.Lease.Key
	} else {
		tagKey = op.Parts[0].Key
	}
	sh := s.shard(tagKey)
	var wall int64
	if op.nowIsWall && op.Now != 0 {
		// The caller's reading of the wall clock, a moment ago: expiry
		// only reclaims memory, it never changes an answer.
		wall, op.nowIsWall = op.Now*int64(time.Microsecond), false
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if wall == 0 {
		wall = s.wallNow()
	}

	if op.Mode == ModeRelease {
		if k := sh.get(op.Lease.Key, wall); k != nil {
			delete(k.leases, op.Lease.ID)
		}
		return Reply{Status: StatusAllowed, Now: now, InFlight: -1}, nil
	}
	m := memDo{s: s, sh: sh, op: op, now: now, wall: wall,
		peek: op.Mode == ModePeek, record: op.Mode == ModeRecord}
	m.reply = Reply{Now: now, InFlight: -1, Usage: op.usageFor(op.windows())}
	if m.override() {
		return m.reply, nil
	}
	ban := m.checkBan()
	// Room for four windows' evaluations (a region's and a global's two):
	// an Op with more appends to the heap. A winEval carries a counter's
	// ring (about 560 bytes): room for the most windows (16) made Do's frame
	// 10 KB, zeroed on every call and growing the goroutine's stack after
	// each collection shrank it.
	var evbuf [4]winEval
	evs := evbuf[:0]
	if n := m.op.windows(); n > len(evbuf) {
		evs = make([]winEval, 0, n)
	}
	keys := make([]*memKey, len(m.op.Parts))
	restate := make([]bool, len(m.op.Parts)) // a token state under another interval or burst
	evs, fits, others, shareFit := m.checkParts(evs, keys, restate)
	lease := m.checkLease()

	allowed := m.record || (m.reply.BanLeft == 0 && fits && !m.reply.LeaseDenied)
	recording := allowed && !m.peek && m.op.Mode != ModeCheckOnly
	m.recordParts(evs, keys, restate, recording)
	if !m.peek && !m.record {
		m.shares(evs, keys, shareFit, m.reply.BanLeft == 0 && !m.reply.LeaseDenied && others, recording)
	}
	if allowed && !m.peek && m.op.Lease != nil && !m.record {
		m.grantLease(lease)
	}
	m.counterResets(evs)
	if m.ovEnd > 0 {
		// The limits come back when the override ends: no retry goes past it.
		for j := range evs {
			evs[j].retry = min(evs[j].retry, m.ovEnd-m.now)
		}
	}
	m.status(allowed)
	if !(m.reply.Share&ShareAsk != 0 && others) {
		m.countBan(ban, fits, evs)
	}
	for _, ev := range evs {
		m.reply.Usage = append(m.reply.Usage, Usage{Count: ev.count, Retry: ev.retry, Reset: ev.reset})
	}
	return m.reply, nil
}

// memDo is one Op being decided by Do, under its shard's lock.
type memDo struct {
	s            *MemoryStore
	sh           *memShard
	op           *Op   // the Op, or its copy under the identity's overrides
	now          int64 // µs, the Op's clock
	wall         int64 // ns, the wall clock keys expire on
	peek, record bool
	reply        Reply
	ovEnd        int64 // µs: when the override that changed a limit ends
	shareNew     bool  // the share part's share has no answer of the ledger under its limits
}

// override applies the identity's overrides to the Op. It reports whether
// the reply is final: the cost is above an overridden window's capacity.
func (m *memDo) override() bool {
	op := m.op
	if op.Override == nil {
		return false
	}
	k := m.sh.get(op.Override.Key, m.wall)
	if k == nil || len(k.ov) == 0 {
		return false
	}
	c := overriddenCopy(op)
	changed, ends := applyOverride(k.ov, c, m.now)
	if !changed {
		return false
	}
	m.op, m.ovEnd = c, ends
	m.reply.Limits, m.reply.Bursts = limitsOf(c)
	if c.Mode != ModeRecord && tooLarge(c) {
		m.reply.Status = StatusTooLarge
		m.reply.Usage = m.reply.Usage[:c.windows()]
		return true
	}
	return false
}

// checkBan returns the ban key (nil when it has none) and sets the ban's
// time left.
func (m *memDo) checkBan() *memKey {
	op := m.op
	if op.Ban == nil || m.record {
		return nil
	}
	ban := m.sh.get(op.Ban.Key, m.wall)
	if ban != nil && ban.banU > m.now {
		m.reply.BanLeft = ban.banU - m.now
	}
	return ban
}

// checkParts evaluates every window of every part, appending the windows'
// evaluations to evs (whose capacity holds them all), and sets each part's
// key (nil when it has no state) and whether its token state is under
// another interval or burst. It returns the evaluations and whether the
// cost fits every window.
func (m *memDo) checkParts(evs []winEval, keys []*memKey, restate []bool) (_ []winEval, fits, others, shareFit bool) {
	op := m.op
	fits, others, shareFit = true, true, true
	fnow, fcost := float64(m.now), float64(op.Cost)
	for i := range op.Parts {
		p := &op.Parts[i]
		k := m.sh.get(p.Key, m.wall)
		keys[i] = k
		pe := evs[len(evs) : len(evs)+len(p.Windows)]
		evs = evs[:len(evs)+len(p.Windows)]
		var states []winState
		if k != nil {
			states = k.wins
		}
		var ok bool
		switch p.Kind {
		case KindShare:
			ok = m.shareCheck(p, k, pe)
			shareFit = ok
		case KindLog:
			l := &logState{}
			if k != nil {
				l = &k.log
			}
			ok = logCheck(l, p.Windows, pe, m.now, op.Cost, m.peek)
		case KindCounter:
			ok = ctrCheck(states, p.Windows, pe, fnow, fcost)
		case KindFixed:
			ok = fixCheck(states, p.Windows, pe, fnow, fcost)
		case KindToken:
			// As decide.lua: the hash is rewritten even when the check
			// records nothing when it holds fields of windows a reload
			// replaced (recordParts).
			rewrite := k != nil && !m.peek && !complete(states, p.Windows) && hasStale(states, p.Windows)
			ok, restate[i] = tbCheck(states, p.Windows, pe, fnow, fcost, rewrite)
		default:
			ok = calCheck(states, p.Windows, pe, fnow, fcost)
		}
		if !ok {
			fits = false
			others = others && p.Kind == KindShare
		}
	}
	return evs, fits, others, shareFit
}

// shares writes the check's effect on its share parts (share.go).
func (m *memDo) shares(evs []winEval, keys []*memKey, fit, demand, recording bool) {
	off := 0
	for i := range m.op.Parts {
		p := &m.op.Parts[i]
		if p.Kind == KindShare {
			m.reply.Share |= m.shareAfter(p, p.Key, keys[i], evs[off:off+len(p.Windows)], fit, demand, recording)
		}
		off += len(p.Windows)
	}
}

// checkLease returns the lease key (nil when it has none) and sets the
// leases in flight and whether one more is denied; a check drops the
// expired leases.
func (m *memDo) checkLease() *memKey {
	op := m.op
	if op.Lease == nil || m.record {
		return nil
	}
	lease := m.sh.get(op.Lease.Key, m.wall)
	var n int64
	if lease != nil {
		for id, exp := range lease.leases {
			if exp <= m.now {
				if !m.peek {
					delete(lease.leases, id)
				}
				continue
			}
			n++
		}
	}
	m.reply.InFlight = n
	m.reply.LeaseDenied = n >= op.Lease.Max
	return lease
}

// recordParts records the cost in every part when recording, and rewrites
// a part's hash holding windows a reload replaced even when not.
func (m *memDo) recordParts(evs []winEval, keys []*memKey, restate []bool, recording bool) {
	op := m.op
	off := 0
	for i := range op.Parts {
		p := &op.Parts[i]
		pe := evs[off : off+len(p.Windows)]
		off += len(p.Windows)
		k := keys[i]
		if p.Kind == KindShare {
			continue
		}
		if p.Kind == KindLog {
			if recording {
				if k == nil {
					k = &memKey{}
				}
				if ttl := logRecord(&k.log, p.Windows, pe, m.now, op.Cost); ttl > 0 {
					expire(k, ttl, m.wall)
				}
				m.s.put(m.sh, p.Key, k)
			}
			continue
		}
		// As hash_read: the hash holds fields of other windows when one of
		// its windows has none (winStale), and then a check rewrites it in
		// its windows even when it records nothing. A token state under
		// another interval or burst (restate) is rewritten only by a check
		// that records, as decide.lua does: rewritten on a denial, capped
		// at this node's full bucket, it would show a node of a larger
		// bucket fewer units in use than when it denied. Either way a
		// rewrite starts the hash from scratch; else it is updated.
		winStale := k != nil && !complete(k.wins, p.Windows) && hasStale(k.wins, p.Windows)
		if !recording && (!winStale || m.peek) {
			continue
		}
		m.recordHash(p, k, pe, winStale || k != nil && restate[i], recording)
	}
}

// recordHash writes one hash part's window states: the cost when
// recording, else (a stale hash) the same states in the new windows.
func (m *memDo) recordHash(p *Part, k *memKey, pe []winEval, stale, recording bool) {
	fnow := float64(m.now)
	// A hash holding windows a reload replaced is rewritten in the new
	// windows even when nothing is recorded (cost 0), as the script does.
	c := float64(m.op.Cost)
	var resets [2 * MaxWindows]int64
	if !recording {
		c = 0
		for j := range pe {
			resets[j] = pe[j].reset
		}
	}
	if k == nil {
		k = &memKey{}
	}
	var fresh []winState
	if !stale && len(k.wins) == len(p.Windows) && !hasStale(k.wins, p.Windows) {
		// The key holds these windows and no other: their new states
		// replace the old in place (the records read only pe).
		fresh = k.wins[:0]
	}
	var ttl int64
	switch p.Kind {
	case KindCounter:
		fresh, ttl = ctrRecord(p.Windows, pe, c, fresh)
	case KindFixed:
		fresh, ttl = fixRecord(p.Windows, pe, fnow, c, fresh)
	case KindToken:
		fresh, ttl = tbRecord(p.Windows, pe, fnow, c, fresh)
	default:
		fresh, ttl = calRecord(p.Windows, pe, fnow, c, fresh)
	}
	if !stale {
		for _, old := range k.wins {
			if !isWindow(old.name, p.Windows) {
				fresh = append(fresh, old)
			}
		}
	}
	k.wins = fresh
	if !recording {
		for j := range pe {
			pe[j].reset = resets[j]
		}
	}
	expire(k, ttl, m.wall)
	m.s.put(m.sh, p.Key, k)
}

// grantLease adds the Op's lease to the lease key.
func (m *memDo) grantLease(lease *memKey) {
	l := m.op.Lease
	if lease == nil {
		lease = &memKey{}
	}
	if lease.leases == nil {
		lease.leases = make(map[string]int64)
	}
	lease.leases[l.ID] = m.now + l.Timeout
	expire(lease, (l.Timeout+999)/1000+1000, m.wall)
	m.s.put(m.sh, l.Key, lease)
	m.reply.InFlight++
}

// counterResets sets the sliding counters' resets, after recording.
func (m *memDo) counterResets(evs []winEval) {
	off := 0
	for i := range m.op.Parts {
		p := &m.op.Parts[i]
		if p.Kind == KindCounter {
			ctrReset(p.Windows, evs[off:off+len(p.Windows)], float64(m.now))
		}
		off += len(p.Windows)
	}
}

// status sets the reply's status.
func (m *memDo) status(allowed bool) {
	switch {
	case m.reply.BanLeft > 0:
		m.reply.Status = StatusBanned
	case allowed:
		m.reply.Status = StatusAllowed
	default:
		m.reply.Status = StatusDenied
	}
}

// countBan counts the Op's refusal by a window towards a ban, starting the
// ban at its threshold. A refusal whose windows all have room within the
// time the request may still wait in the queue (b.Wait) is not counted.
func (m *memDo) countBan(ban *memKey, fits bool, evs []winEval) {
	b := m.op.Ban
	if b == nil || m.reply.BanLeft != 0 || (m.op.Mode != ModeCheck && m.op.Mode != ModeCheckOnly) || fits {
		return
	}
	var retry int64
	for _, ev := range evs {
		retry = max(retry, ev.retry)
	}
	if retry <= b.Wait {
		return
	}
	if ban == nil {
		ban = &memKey{}
	}
	if banCount(ban, 1, m.now, b) {
		m.reply.Status, m.reply.BanLeft, m.reply.BanStarted = StatusBanned, b.For, true
	}
	span := int64(math.Ceil(2*float64(b.Within)/1000)) + 1000
	ttl := span
	if m.reply.BanStarted {
		ttl = max(int64(math.Ceil(float64(b.For)/1000))+1000, span)
	}
	expire(ban, ttl, m.wall)
	m.s.put(m.sh, b.Key, ban)
}

// complete reports whether every window of wins has a state.
func complete(states []winState, wins []Win) bool {
	for j := range wins {
		if stateOf(states, wins[j].Name) == nil {
			return false
		}
	}
	return true
}

// hasStale reports whether states hold a window wins no longer has.
func hasStale(states []winState, wins []Win) bool {
	for i := range states {
		if !isWindow(states[i].name, wins) {
			return true
		}
	}
	return false
}

// banCount is ban_count: it adds n denials and bans the key when the
// weighted count reaches After.
func banCount(k *memKey, n, now int64, b *BanOp) bool {
	within := float64(b.Within)
	fnow := float64(now)
	idx := math.Floor(fnow / within)
	cur, prev := 0.0, 0.0
	if k.hasBan {
		sw := float64(k.banW)
		switch {
		case sw == idx:
			cur, prev = float64(k.banC), float64(k.banP)
		case sw == idx-1:
			prev = float64(k.banC)
		case sw > idx:
			idx, cur, prev = sw, float64(k.banC), float64(k.banP)
		}
	}
	cur = cur + float64(n)
	t := fnow
	if float64(idx*within) > t {
		t = float64(idx * within)
	}
	if ctrEst(within, t, idx, cur, prev) >= float64(b.After) {
		k.banU, k.banW, k.banC, k.banP, k.hasBan = now+b.For, int64(idx), 0, 0, true
		return true
	}
	k.banW, k.banC, k.banP, k.hasBan = int64(idx), int64(cur), int64(prev), true
	return false
}

func (s *MemoryStore) janitor(every time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			for i := range s.shards {
				s.expireSome(&s.shards[i])
			}
		}
	}
}

// expireSome drops expired keys of one shard by sampling, as Redis's active
// expiry does: 20 keys at a time, again while more than 2 of them had
// expired, at most 16 rounds (so a shard is never held for long, and about a
// tenth of its keys at most wait for a later pass).
func (s *MemoryStore) expireSome(sh *memShard) {
	now := s.wallNow()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for round := 0; round < 16; round++ {
		seen, dropped := 0, 0
		for k, v := range sh.m {
			if v.wall <= now {
				delete(sh.m, k)
				dropped++
			}
			if seen++; seen == 20 {
				break
			}
		}
		if dropped <= 2 {
			return
		}
	}
}
