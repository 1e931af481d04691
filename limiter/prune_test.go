package limiter

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestLogPruneAsSearch: prune's look at the oldest entries first drops
// what a search over the whole log drops, and compacts as it did.
func TestLogPruneAsSearch(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var l logState
		n := rng.IntN(80)
		at := int64(0)
		for i := range n {
			at += rng.Int64N(3)
			l.entries = append(l.entries, logEntry{t: at, b: int64(i)})
		}
		if n > 0 {
			l.head = rng.IntN(n)
		}
		want := logState{entries: slices.Clone(l.entries), head: l.head}
		cut := rng.Int64N(at+3) - 1
		e := want.live()
		want.head += sort.Search(len(e), func(i int) bool { return e[i].t > cut })
		if want.head == len(want.entries) {
			want.entries, want.head = want.entries[:0], 0
		} else if want.head > 32 && want.head > len(want.entries)/2 {
			want.entries = append(want.entries[:0], want.entries[want.head:]...)
			want.head = 0
		}
		l.prune(cut)
		if l.head != want.head || !slices.Equal(l.entries, want.entries) {
			t.Fatalf("prune(%d): head %d, %d entries; want head %d, %d entries", cut, l.head, len(l.entries), want.head, len(want.entries))
		}
	}
}
