package limiter

import (
	"fmt"
	"time"
)

// Period is a calendar period: a quota that resets at the start of each
// hour, day, week (Monday) or month in the limiter's time zone, daylight
// saving included. It is a fixed window by nature: its count starts again
// at each period's start, whatever the algorithm of the duration windows.
type Period uint8

// The periods.
const (
	PeriodNone Period = iota
	PeriodHour
	PeriodDay
	PeriodWeek
	PeriodMonth
)

var periodNames = [...]string{PeriodHour: "hour", PeriodDay: "day", PeriodWeek: "week", PeriodMonth: "month"}

func (p Period) String() string {
	if p > PeriodNone && int(p) < len(periodNames) {
		return periodNames[p]
	}
	return fmt.Sprintf("period(%d)", p)
}

// ParsePeriod maps "hour", "day", "week" or "month" to a Period.
func ParsePeriod(s string) (Period, bool) {
	for i, n := range periodNames {
		if n != "" && n == s {
			return Period(i), true
		}
	}
	return PeriodNone, false
}

// start is the start of the period holding t, in loc, shifted by n periods.
func (p Period) start(t time.Time, n int) time.Time {
	y, m, d := t.Date()
	loc := t.Location()
	switch p {
	case PeriodHour:
		// The hour's start on the wall clock is exact in every zone (DST
		// moves whole hours or half hours at hour boundaries).
		s := t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
		return s.Add(time.Duration(n) * time.Hour)
	case PeriodDay:
		return time.Date(y, m, d+n, 0, 0, 0, 0, loc)
	case PeriodWeek:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		return time.Date(y, m, d-back+7*n, 0, 0, 0, 0, loc)
	default:
		return time.Date(y, m+time.Month(n), 1, 0, 0, 0, 0, loc)
	}
}

// Bounds returns, in µs, the starts of the periods before, holding and
// after t (in loc), and the end of the one after: a script on another clock
// picks the period that holds its own now.
func (p Period) Bounds(t time.Time, loc *time.Location) [4]int64 {
	t = t.In(loc)
	var b [4]int64
	for i := range b {
		b[i] = p.start(t, i-1).UnixMicro()
	}
	return b
}
