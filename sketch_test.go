package slidingratelimit

// The Space-Saving sketch: exact below capacity, every heavy hitter kept
// with its count bounded, fixed memory whatever the distinct items.

import (
	"math/rand/v2"
	"testing"
)

// checkSketch checks the sketch's own structure: every counter is found
// through the index where the heap says it is, the index holds nothing
// else, the heap is a min-heap, and the counts sum to the events seen.
func checkSketch(t *testing.T, s *spaceSaving, events int64) {
	t.Helper()
	var sum int64
	for i := range s.counters {
		c := &s.counters[i]
		if _, ci := s.find(c.id); ci != int32(i) {
			t.Fatalf("counter %d (id %x) not found through the index (got %d)", i, c.id, ci)
		}
		if s.heap[c.pos] != int32(i) {
			t.Fatalf("counter %d at heap position %d, which holds %d", i, c.pos, s.heap[c.pos])
		}
		sum += c.count
	}
	used := 0
	for _, v := range s.index {
		if v != 0 {
			used++
		}
	}
	if used != len(s.counters) || len(s.heap) != len(s.counters) {
		t.Fatalf("%d index slots and %d heap entries for %d counters", used, len(s.heap), len(s.counters))
	}
	for i := 1; i < len(s.heap); i++ {
		if s.less(i, (i-1)/2) {
			t.Fatalf("heap order broken at %d", i)
		}
	}
	if sum != events {
		t.Fatalf("counts sum to %d, %d events seen", sum, events)
	}
}

// checkBounds checks every counter's count against the true counts: the
// true count is within [count-err, count], and err is at most N/k.
func checkBounds(t *testing.T, s *spaceSaving, truth map[uint64]int64, events int64) {
	t.Helper()
	k := int64(cap(s.counters))
	for i := range s.counters {
		c := &s.counters[i]
		if tr := truth[c.id]; tr < c.count-c.err || tr > c.count {
			t.Fatalf("id %x: true count %d outside [%d, %d]", c.id, tr, c.count-c.err, c.count)
		}
		if c.err > events/k {
			t.Fatalf("id %x: error %d above N/k = %d", c.id, c.err, events/k)
		}
	}
	for id, tr := range truth {
		if tr > events/k && s.get(id) == nil {
			t.Fatalf("id %x seen %d times (> N/k = %d) holds no counter", id, tr, events/k)
		}
		if s.get(id) == nil && tr > s.floor() {
			t.Fatalf("id %x seen %d times without a counter, above the floor %d", id, tr, s.floor())
		}
	}
}

func TestSpaceSavingExactBelowCapacity(t *testing.T) {
	t.Parallel()
	s := newSpaceSaving(16)
	truth := map[uint64]int64{}
	var stream []uint64
	for id := uint64(1); id <= 10; id++ {
		truth[id] = int64(id * 7)
		for range id * 7 {
			stream = append(stream, id)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, id := range stream {
		s.add(id)
	}
	checkSketch(t, s, int64(len(stream)))
	for id, want := range truth {
		c := s.get(id)
		if c == nil || c.count != want || c.err != 0 {
			t.Fatalf("id %d: %+v, want exactly %d", id, c, want)
		}
	}
	if s.floor() != 0 || s.get(99) != nil {
		t.Fatalf("floor %d with free counters, or a counter for an unseen id", s.floor())
	}
}

// TestSpaceSavingHeavyHitters: a few heavy items among tens of thousands
// of light ones keep their counters from their first event, so their counts
// are exact; every count bounds the truth.
func TestSpaceSavingHeavyHitters(t *testing.T) {
	t.Parallel()
	const k = 64
	s := newSpaceSaving(k)
	heavy := map[uint64]int64{1: 3000, 2: 2000, 3: 1500}
	truth := map[uint64]int64{}
	// The heavy items start first, while counters are free, with a head
	// start of 20 events; their share of the rest (2% or more) outpaces
	// the floor's (1/64 of the events), so they are never evicted.
	const head = 20
	for id := range heavy {
		for range head {
			s.add(id)
		}
		truth[id] += head
	}
	var stream []uint64
	for id, n := range heavy {
		for range n - head {
			stream = append(stream, id)
		}
	}
	for id := uint64(1000); id < 51000; id++ { // singletons
		stream = append(stream, id)
	}
	for id := uint64(100); id < 2100; id++ { // light repeaters
		for range 5 {
			stream = append(stream, id)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, id := range stream {
		s.add(id)
		truth[id]++
	}
	events := int64(len(stream) + head*len(heavy))
	checkSketch(t, s, events)
	checkBounds(t, s, truth, events)
	for id, n := range heavy {
		if c := s.get(id); c == nil || c.count != n || c.err != 0 {
			t.Fatalf("heavy id %d: %+v, want exactly %d", id, c, n)
		}
	}
}

// TestSpaceSavingFixedMemory: a million distinct items leave the sketch at
// its k counters, in the arrays it was built with.
func TestSpaceSavingFixedMemory(t *testing.T) {
	t.Parallel()
	const k = 1024
	s := newSpaceSaving(k)
	counters, heap, index := &s.counters[:1][0], &s.heap[:1][0], &s.index[0]
	slots := len(s.index)
	const n = 1_000_000
	for id := uint64(1); id <= n; id++ {
		s.add(id * 2654435761)
	}
	if len(s.counters) != k || cap(s.counters) != k || len(s.index) != slots {
		t.Fatalf("%d counters (cap %d), %d index slots; want %d, %d, %d", len(s.counters), cap(s.counters), len(s.index), k, k, slots)
	}
	if &s.counters[0] != counters || &s.heap[0] != heap || &s.index[0] != index {
		t.Fatal("the sketch's arrays were reallocated")
	}
	checkSketch(t, s, n)
	// Singletons only: the counts are all N/k or N/k+1.
	if f := s.floor(); f != n/k {
		t.Fatalf("floor %d, want N/k = %d", f, n/k)
	}
}

// TestSpaceSavingEviction: the least counted (of equals, the stalest) gives
// its counter up, and the newcomer inherits its count as error.
func TestSpaceSavingEviction(t *testing.T) {
	t.Parallel()
	s := newSpaceSaving(2)
	for _, id := range []uint64{'a', 'a', 'a', 'b'} {
		s.add(id)
	}
	c, fresh := s.add('c') // evicts b (1)
	if !fresh || c.count != 2 || c.err != 1 || s.get('b') != nil {
		t.Fatalf("c after evicting b: %+v fresh=%v", c, fresh)
	}
	c, fresh = s.add('d') // evicts c (2 < a's 3)
	if !fresh || c.count != 3 || c.err != 2 || s.get('c') != nil || s.get('a').count != 3 {
		t.Fatalf("d after evicting c: %+v fresh=%v", c, fresh)
	}
	s.add('a') // a 4, d 3
	c, _ = s.add('e')
	if c.count != 4 || c.err != 3 || s.get('d') != nil {
		t.Fatalf("e after evicting d: %+v", c)
	}
	// Equal counts: the one counted longest ago goes.
	s = newSpaceSaving(2)
	for _, id := range []uint64{'x', 'y', 'x', 'y', 'z'} {
		s.add(id)
	}
	if s.get('x') != nil || s.get('y') == nil {
		t.Fatal("of two counts of 2, the one counted last was evicted")
	}
	checkSketch(t, s, 5)
	s.reset()
	if len(s.counters) != 0 || s.get('y') != nil || s.floor() != 0 {
		t.Fatal("reset left counters")
	}
}

// TestSpaceSavingRandom: random streams over small universes (constant
// eviction, crowded index) against exact counts.
func TestSpaceSavingRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		k := 1 + rng.IntN(40)
		universe := 1 + rng.IntN(4*k+10)
		s := newSpaceSaving(k)
		truth := map[uint64]int64{}
		n := rng.IntN(3000)
		for range n {
			// Skewed: low ids more often; ids that share index homes.
			id := uint64(rng.IntN(1+rng.IntN(universe))) << 40
			s.add(id)
			truth[id]++
		}
		checkSketch(t, s, int64(n))
		checkBounds(t, s, truth, int64(n))
	}
}
