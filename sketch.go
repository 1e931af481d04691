package slidingratelimit

// The heavy-hitters sketch behind the top offenders: fixed memory whatever
// the number of distinct keys.

import "math/bits"

// spaceSaving is a Space-Saving summary (Metwally, Agrawal and El Abbadi,
// "Efficient Computation of Frequent and Top-k Elements in Data Streams",
// 2005) over a fixed number k of counters. An item that holds a counter has
// it incremented; a new item takes a free counter or, when all k are taken,
// the counter with the smallest count, inheriting that count as its error.
// So a count never under-states: an item's true count is within
// [count-err, count], the counts sum to the events seen, and every item
// seen more than N/k times in N events holds a counter.
//
// Memory is allocated once, in newSpaceSaving: the counters, a min-heap of
// them by count, and an open-addressing index from item to counter. Nothing
// grows with the number of distinct items. Not safe for concurrent use.
type spaceSaving struct {
	counters []counter // the counters in use; cap is k
	heap     []int32   // indexes of counters: a min-heap by (count, tick)
	index    []int32   // linear probing: a counter's index + 1, 0 when empty
	shift    uint      // 64 - log2(len(index))
	tick     uint64    // events seen, to tell the staler of equal counts
}

// counter is one monitored item: its count, the count's possible
// over-statement, and what the top offenders show of the item.
type counter struct {
	id    uint64 // the item
	count int64  // events counted, err of them possibly another item's
	err   int64
	tick  uint64 // the event that last counted it
	pos   int32  // its place in the heap

	hash   [6]byte // the display hash of the key (12 hex digits)
	key    string  // the raw key, kept only with log_key
	region string
	retry  int64 // the last Retry-After, in seconds
	seen   int64 // the last event, unix ns
}

// newSpaceSaving returns a summary of k counters (k >= 1).
func newSpaceSaving(k int) *spaceSaving {
	size := 2
	for size < 2*k {
		size <<= 1
	}
	return &spaceSaving{
		counters: make([]counter, 0, k),
		heap:     make([]int32, 0, k),
		index:    make([]int32, size),
		shift:    uint(64 - bits.TrailingZeros(uint(size))),
	}
}

// add counts one event of id and returns its counter, and whether the
// counter was just taken (its other fields are then zero, for the caller to
// fill in).
func (s *spaceSaving) add(id uint64) (*counter, bool) {
	s.tick++
	slot, ci := s.find(id)
	if ci >= 0 {
		c := &s.counters[ci]
		c.count++
		c.tick = s.tick
		s.down(int(c.pos))
		return c, false
	}
	if len(s.counters) < cap(s.counters) {
		ci = int32(len(s.counters))
		s.counters = append(s.counters, counter{id: id, count: 1, tick: s.tick, pos: int32(len(s.heap))})
		s.heap = append(s.heap, ci)
		s.index[slot] = ci + 1
		s.up(len(s.heap) - 1)
		return &s.counters[ci], true
	}
	// Full: the least counted (of those, the stalest) gives its counter up.
	ci = s.heap[0]
	c := &s.counters[ci]
	s.unindex(c.id)
	slot, _ = s.find(id)
	s.index[slot] = ci + 1
	*c = counter{id: id, count: c.count + 1, err: c.count, tick: s.tick}
	s.down(0)
	return c, true
}

// get returns id's counter, or nil.
func (s *spaceSaving) get(id uint64) *counter {
	if _, ci := s.find(id); ci >= 0 {
		return &s.counters[ci]
	}
	return nil
}

// floor is the most an item without a counter may have been seen: the
// smallest count when every counter is taken, else 0.
func (s *spaceSaving) floor() int64 {
	if len(s.counters) < cap(s.counters) {
		return 0
	}
	return s.counters[s.heap[0]].count
}

// reset forgets every item, keeping the memory.
func (s *spaceSaving) reset() {
	clear(s.counters) // drop the strings
	s.counters = s.counters[:0]
	s.heap = s.heap[:0]
	clear(s.index)
}

// home is the index slot where id's probe starts.
func (s *spaceSaving) home(id uint64) uint64 { return (id * 0x9e3779b97f4a7c15) >> s.shift }

// find returns the slot holding id and its counter, or the empty slot where
// it would go and -1.
func (s *spaceSaving) find(id uint64) (uint64, int32) {
	mask := uint64(len(s.index) - 1)
	for i := s.home(id); ; i = (i + 1) & mask {
		v := s.index[i]
		if v == 0 {
			return i, -1
		}
		if s.counters[v-1].id == id {
			return i, v - 1
		}
	}
}

// unindex removes id from the index, shifting back the entries after it so
// that every probe still finds its item (no tombstones: the index never
// fills up with deleted slots).
func (s *spaceSaving) unindex(id uint64) {
	i, ci := s.find(id)
	if ci < 0 {
		return
	}
	mask := uint64(len(s.index) - 1)
	for {
		s.index[i] = 0
		j := i
		for {
			j = (j + 1) & mask
			if s.index[j] == 0 {
				return
			}
			// The entry at j may fill slot i unless its probe starts
			// (cyclically) after i, up to j.
			k := s.home(s.counters[s.index[j]-1].id)
			if j > i && (k <= i || k > j) || j < i && k <= i && k > j {
				break
			}
		}
		s.index[i] = s.index[j]
		i = j
	}
}

// less orders the heap: the smaller count first; of equal counts, the one
// counted longest ago.
func (s *spaceSaving) less(a, b int) bool {
	x, y := &s.counters[s.heap[a]], &s.counters[s.heap[b]]
	return x.count < y.count || x.count == y.count && x.tick < y.tick
}

func (s *spaceSaving) swap(a, b int) {
	s.heap[a], s.heap[b] = s.heap[b], s.heap[a]
	s.counters[s.heap[a]].pos = int32(a)
	s.counters[s.heap[b]].pos = int32(b)
}

func (s *spaceSaving) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *spaceSaving) down(i int) {
	n := len(s.heap)
	for {
		m, l, r := i, 2*i+1, 2*i+2
		if l < n && s.less(l, m) {
			m = l
		}
		if r < n && s.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		s.swap(i, m)
		i = m
	}
}
