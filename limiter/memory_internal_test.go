package limiter

import (
	"context"
	"testing"
	"time"
)

// TestSweepIgnoresOtherClocks: the janitor judges expiry on the wall clock,
// so a limiter whose requests carry a later clock never expires the state
// of a limiter on an earlier (or frozen test) clock, and the reverse.
func TestSweepIgnoresOtherClocks(t *testing.T) {
	s := NewMemoryStore()
	defer s.Close()
	ctx := context.Background()
	past := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	future := time.Now().Add(24 * time.Hour)
	for _, at := range []time.Time{past, future} {
		req := &Request{Window: time.Minute, Now: at, Bucket: Bucket{Key: "k:{" + at.Format("2006") + "}", Limit: 1}}
		if res, err := s.Allow(ctx, req); err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
	}
	s.sweep()
	if s.Len() != 2 {
		t.Fatalf("sweep dropped live state: %d keys left, want 2", s.Len())
	}
	// Once their wall-clock time to live has passed, both go.
	for i := range s.shards {
		for _, st := range s.shards[i].m {
			st.wallExpires = time.Now().Add(-time.Second).UnixNano()
		}
	}
	s.sweep()
	if s.Len() != 0 {
		t.Fatalf("%d keys left after their time to live", s.Len())
	}
}
