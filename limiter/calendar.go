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

// start is the start of the period holding t, in loc, shifted by n periods
// (days, weeks and months; hours are hourStart's).
func (p Period) start(t time.Time, n int) time.Time {
	y, m, d := t.Date()
	loc := t.Location()
	switch p {
	case PeriodDay:
		return time.Date(y, m, d+n, 0, 0, 0, 0, loc)
	case PeriodWeek:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		return time.Date(y, m, d-back+7*n, 0, 0, 0, 0, loc)
	default:
		return time.Date(y, m+time.Month(n), 1, 0, 0, 0, 0, loc)
	}
}

// An hour starts when the wall clock reads hh:00:00, and when the zone's
// offset changes: a shift of a whole hour falls on an hour's start anyway,
// a shift of 30 minutes (Australia/Lord_Howe) cuts the hour it falls in into
// two shorter periods, each with its real length. So no two hours overlap,
// and none is longer than an hour.

// wallHour is the last time at or before t that the wall clock read
// hh:00:00 in t's offset.
func wallHour(t time.Time) time.Time {
	return t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
}

// hourStart is the start of the hour period holding t.
func hourStart(t time.Time) time.Time {
	s := wallHour(t)
	if zs, _ := t.ZoneBounds(); zs.After(s) && offsetChanges(zs) {
		s = zs
	}
	return s
}

// hourEnd is the end of the hour period holding t (the next one's start).
func hourEnd(t time.Time) time.Time {
	e := wallHour(t).Add(time.Hour)
	if _, ze := t.ZoneBounds(); !ze.IsZero() && ze.Before(e) && offsetChanges(ze) {
		e = ze
	}
	return e
}

// offsetChanges reports whether the zone's offset at t differs from the
// one just before (a zone may change only its name).
func offsetChanges(t time.Time) bool {
	_, before := t.Add(-time.Nanosecond).Zone()
	_, after := t.Zone()
	return before != after
}

// Bounds returns, in µs, the starts of the periods before, holding and
// after t (in loc), and the end of the one after: a script on another clock
// picks the period that holds its own now.
func (p Period) Bounds(t time.Time, loc *time.Location) [4]int64 {
	t = t.In(loc)
	var b [4]int64
	if p == PeriodHour {
		start, end := hourStart(t), hourEnd(t)
		b[0], b[1] = hourStart(start.Add(-time.Nanosecond)).UnixMicro(), start.UnixMicro()
		b[2], b[3] = end.UnixMicro(), hourEnd(end).UnixMicro()
		return b
	}
	for i := range b {
		b[i] = p.start(t, i-1).UnixMicro()
	}
	return b
}

// Longest is the longest the period can be (a DST change included).
func (p Period) Longest() time.Duration {
	switch p {
	case PeriodHour:
		return time.Hour + 30*time.Minute
	case PeriodDay:
		return 25 * time.Hour
	case PeriodWeek:
		return 7*24*time.Hour + time.Hour
	case PeriodMonth:
		return 31*24*time.Hour + time.Hour
	}
	return 0
}
