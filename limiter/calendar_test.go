package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// lordHowe shifts its clocks by 30 minutes: on 2026-10-04 at 2:00 (+10:30)
// they go to 2:30 (+11), at 2026-10-03 15:30 UTC; on 2026-04-05 at 2:00
// (+11) back to 1:30 (+10:30), at 2026-04-04 15:00 UTC.
func lordHowe(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Australia/Lord_Howe")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCalendarHourAcrossHalfHourShift: an hour quota in a zone whose clocks
// move 30 minutes. The hour that the shift cuts short lasts 30 minutes: its
// reported length (RateLimit-Policy w=) is 1800 s, and a denial in it is
// told to come back at its end. Every hour starts where the one before it
// ended.
func TestCalendarHourAcrossHalfHourShift(t *testing.T) {
	t.Parallel()
	loc := lordHowe(t)
	cases := []struct {
		name      string
		at        time.Time
		seconds   int64         // the period's real length
		retry     time.Duration // its end, from at
		startsUTC string
	}{
		{"before the spring shift, 1:50 +10:30", utc("2026-10-03T15:20:00Z"), 3600, 10 * time.Minute, "2026-10-03T14:30:00Z"},
		{"after the spring shift, 2:40 +11", utc("2026-10-03T15:40:00Z"), 1800, 20 * time.Minute, "2026-10-03T15:30:00Z"},
		{"before the autumn shift, 1:50 +11", utc("2026-04-04T14:50:00Z"), 3600, 10 * time.Minute, "2026-04-04T14:00:00Z"},
		{"after the autumn shift, 1:40 +10:30", utc("2026-04-04T15:10:00Z"), 1800, 20 * time.Minute, "2026-04-04T15:00:00Z"},
		{"the hour after, 2:10 +10:30", utc("2026-04-04T15:40:00Z"), 3600, 50 * time.Minute, "2026-04-04T15:30:00Z"},
	}
	for _, c := range cases {
		clock := &fakeClock{t: c.at}
		mem := limiter.NewMemoryStore()
		l, err := limiter.New(limiter.Policy{Name: "cal", Windows: []limiter.Window{{Period: limiter.PeriodHour}}, Location: loc, Now: clock.Now},
			limiter.Backend{Store: mem, Source: limiter.SourceMemory})
		if err != nil {
			t.Fatal(err)
		}
		in := &limiter.Input{Identity: "k", Limits: []int64{1}}
		ok, _ := l.Decide(context.Background(), in)
		denied, _ := l.Decide(context.Background(), in)
		if got := ok.Windows[0].Seconds; got != c.seconds {
			t.Errorf("%s: the hour's length is reported as %d s, want %d", c.name, got, c.seconds)
		}
		if denied.Outcome != limiter.OutcomeLimited || denied.RetryAfter != c.retry {
			t.Errorf("%s: second request %v, retry %v; want limited until the hour's end, %v", c.name, denied.Outcome, denied.RetryAfter, c.retry)
		}
		if b := limiter.PeriodHour.Bounds(c.at, loc); time.UnixMicro(b[1]).UTC().Format(time.RFC3339) != c.startsUTC {
			t.Errorf("%s: the hour starts at %s, want %s", c.name, time.UnixMicro(b[1]).UTC().Format(time.RFC3339), c.startsUTC)
		}
		l.Close()
		_ = mem.Close()
	}
}

// TestCalendarPeriodsTileTime: minute by minute across both shifts, in
// Lord Howe and in a zone of whole-hour shifts, every period (hour, day)
// holds the time it was computed for, and its neighbours are the periods
// computed from their own times: no two periods overlap, none leaves a
// gap, whichever of the bounds a store on another clock picks.
func TestCalendarPeriodsTileTime(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	spans := []struct {
		loc  *time.Location
		from time.Time
	}{
		{lordHowe(t), utc("2026-10-03T12:00:00Z")}, {lordHowe(t), utc("2026-04-04T12:00:00Z")},
		{berlin, utc("2026-03-28T22:00:00Z")}, {berlin, utc("2026-10-24T22:00:00Z")},
	}
	for _, s := range spans {
		for _, p := range []limiter.Period{limiter.PeriodHour, limiter.PeriodDay} {
			for m := 0; m < 8*60; m++ {
				at := s.from.Add(time.Duration(m) * time.Minute)
				b := p.Bounds(at, s.loc)
				next := p.Bounds(time.UnixMicro(b[2]), s.loc)
				prev := p.Bounds(time.UnixMicro(b[1]-1), s.loc)
				if !(b[1] <= at.UnixMicro() && at.UnixMicro() < b[2]) || next[1] != b[2] || next[2] != b[3] || prev[2] != b[1] || prev[1] != b[0] {
					t.Fatalf("%s %v at %v: bounds %v, the next period's %v, the previous one's %v: they do not tile",
						s.loc, p, at.In(s.loc), times(b), times(next), times(prev))
				}
			}
		}
	}
}

func times(b [4]int64) []string {
	out := make([]string, len(b))
	for i, v := range b {
		out[i] = time.UnixMicro(v).UTC().Format("01-02T15:04Z")
	}
	return out
}

// TestCalendarLengthOnTheStoresClock: with clock redis the store picks the
// period that holds its own now among the bounds it is sent; a store whose
// clock is already in the next period (the 30-minute one after Lord Howe's
// spring shift) reports that period, and the decision says that period's
// length, not the one of Caddy's clock.
func TestCalendarLengthOnTheStoresClock(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: utc("2026-10-03T15:20:00Z")} // 1:50 +10:30: an hour of 3600 s
	mem := limiter.NewMemoryStore()
	defer mem.Close()
	ahead := &switchStore{Store: mem, hook: func(op *limiter.Op) {
		op.Now += (15 * time.Minute).Microseconds() // the store's clock: 2:35 +11, in the hour of 1800 s
	}}
	l, err := limiter.New(limiter.Policy{Name: "cal", Windows: []limiter.Window{{Period: limiter.PeriodHour}}, Location: lordHowe(t), Now: clock.Now},
		limiter.Backend{Store: ahead, Source: limiter.SourceMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	in := &limiter.Input{Identity: "k", Limits: []int64{1}}
	ok, _ := l.Decide(context.Background(), in)
	denied, _ := l.Decide(context.Background(), in)
	if ok.Windows[0].Seconds != 1800 || denied.RetryAfter != 25*time.Minute {
		t.Fatalf("the store decided in the hour of 1800 s: reported length %d s, retry %v; want 1800 s and 25m0s",
			ok.Windows[0].Seconds, denied.RetryAfter)
	}
}
