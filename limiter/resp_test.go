package limiter

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestReadReplies: a batch's raw reply gives each check its own values
// (an array, or flat from a fast path: 8 × n + status, then n - 1 values) or
// its own error, in order, and every check the call's reading of Redis TIME
// (its last element); a check whose reply is neither form of integers is
// malformed alone, and the checks after it still get theirs. A reply that
// cannot be split into one per check and the time fails the whole call.
func TestReadReplies(t *testing.T) {
	t.Parallel()
	type want struct {
		vals []int64
		err  string // a substring of the check's error ("" none)
		bad  bool   // the error is ErrBadReply (else a Redis error reply)
	}
	for _, tc := range []struct {
		name    string
		reply   string
		checks  []want
		time    int64  // the call's reading of Redis TIME
		callErr string // the whole call's error
	}{
		{name: "values of each check, in order, then the call's time",
			reply:  "*3\r\n*3\r\n:1\r\n:2\r\n:3\r\n*3\r\n:-1\r\n:0\r\n:1700000000000000\r\n:1700000000000123\r\n",
			checks: []want{{vals: []int64{1, 2, 3}}, {vals: []int64{-1, 0, 1700000000000000}}}, time: 1700000000000123},
		{name: "an error reply is its check's alone",
			reply:  "*4\r\n*1\r\n:1\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*1\r\n:2\r\n:0\r\n",
			checks: []want{{vals: []int64{1}}, {err: "WRONGTYPE Operation"}, {vals: []int64{2}}}},
		{name: "a value that is not an integer",
			reply:  "*3\r\n*2\r\n:1\r\n$3\r\nabc\r\n*1\r\n:5\r\n:0\r\n",
			checks: []want{{err: "value 1 is a string", bad: true}, {vals: []int64{5}}}},
		{name: "a nested array",
			reply:  "*3\r\n*2\r\n*2\r\n:1\r\n:2\r\n:3\r\n*1\r\n:4\r\n:0\r\n",
			checks: []want{{err: "value 0 is an array", bad: true}, {vals: []int64{4}}}},
		{name: "nil replies (RESP2 and RESP3)",
			reply:  "*5\r\n*-1\r\n$-1\r\n_\r\n*1\r\n:9\r\n:0\r\n",
			checks: []want{{err: "nil", bad: true}, {err: "nil", bad: true}, {err: "nil", bad: true}, {vals: []int64{9}}}},
		{name: "RESP3 values: blob error, map, attribute, verbatim string",
			reply: "*5\r\n!9\r\nERR x\r\nyz\r\n%1\r\n+k\r\n:1\r\n*2\r\n|1\r\n+a\r\n:1\r\n:7\r\n:8\r\n=7\r\ntxt:abc\r\n:0\r\n",
			checks: []want{{err: "ERR x\r\nyz"}, {err: "a map", bad: true}, {err: "value 0 is a value of type '|'", bad: true},
				{err: "a string", bad: true}}},
		{name: "flat replies (a fast path's: 8 × n + status, then n - 1 values) beside arrays",
			reply:  "*9\r\n:25\r\n:2\r\n:3\r\n*2\r\n:4\r\n:5\r\n-ERR x\r\n:8\r\n:22\r\n:7\r\n:5\r\n",
			checks: []want{{vals: []int64{1, 2, 3}}, {vals: []int64{4, 5}}, {err: "ERR x"}, {vals: []int64{0}}, {vals: []int64{6, 7}}}, time: 5},
		{name: "short flat replies (status, count, retry, reset), then the time",
			reply:  "*9\r\n:33\r\n:3\r\n:0\r\n:60000000\r\n:32\r\n:10\r\n:59000000\r\n:1000000\r\n:1796000000000001\r\n",
			checks: []want{{vals: []int64{1, 3, 0, 60000000}}, {vals: []int64{0, 10, 59000000, 1000000}}}, time: 1796000000000001},
		{name: "a flat value that is not an integer",
			reply:  "*4\r\n:17\r\n$3\r\nabc\r\n:13\r\n:0\r\n",
			checks: []want{{err: "value 1 is a string", bad: true}, {vals: []int64{5}}}},
		{name: "a flat reply past the end", reply: "*3\r\n:24\r\n:1\r\n:0\r\n", checks: make([]want, 1), callErr: "first value 24 (8 × its values + its status) where 2 values are left"},
		{name: "a flat reply over the time", reply: "*3\r\n:25\r\n:1\r\n:7\r\n", checks: make([]want, 1), callErr: "first value 25 (8 × its values + its status) where 2 values are left"},
		{name: "a flat reply of no values", reply: "*2\r\n:4\r\n:0\r\n", checks: make([]want, 1), callErr: "first value 4 "},
		{name: "a negative flat first value", reply: "*3\r\n:-1\r\n:1\r\n:0\r\n", checks: make([]want, 1), callErr: "first value -1 "},
		{name: "too many values", reply: "*3\r\n*1\r\n:1\r\n:5\r\n:0\r\n", checks: make([]want, 1), callErr: "1 values left after 1 checks"},
		{name: "no time", reply: "*1\r\n*1\r\n:1\r\n", checks: make([]want, 1), callErr: "1 values for 1 checks and the time, none for check 0"},
		{name: "a time that is not an integer", reply: "*2\r\n*1\r\n:1\r\n$1\r\n0\r\n", checks: make([]want, 1), callErr: "the call's time"},
		{name: "a negative time", reply: "*2\r\n*1\r\n:1\r\n:-1\r\n", checks: make([]want, 1), callErr: "the call's time"},
		{name: "too few replies", reply: "*2\r\n*1\r\n:1\r\n:0\r\n", checks: make([]want, 2), callErr: "2 values for 2 checks and the time, none for check 1"},
		{name: "not an array", reply: "+OK\r\n", checks: make([]want, 1), callErr: "a status for 1 checks"},
		{name: "a RESP3 error for the call", reply: "!11\r\nERR no luck\r\n", checks: make([]want, 1), callErr: "ERR no luck"},
		{name: "cut short", reply: "*3\r\n*3\r\n:1\r\n:2\r\n", checks: make([]want, 2), callErr: "cut short"},
		{name: "nothing", reply: "", checks: make([]want, 1), callErr: "nothing for 1 checks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ops := make([]*batchOp, len(tc.checks))
			for i := range ops {
				ops[i] = &batchOp{vals: []int64{42}} // a stale value must not survive
			}
			err := readReplies([]byte(tc.reply), ops)
			if tc.callErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.callErr) {
					t.Fatalf("the call's error: %v, want one saying %q", err, tc.callErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("the call failed: %v", err)
			}
			for i, w := range tc.checks {
				op := ops[i]
				if op.time != tc.time {
					t.Errorf("check %d: the call's time %d, want %d", i, op.time, tc.time)
				}
				switch {
				case w.err == "":
					if op.err != nil || !slices.Equal(op.vals, w.vals) {
						t.Errorf("check %d: %v %v, want %v", i, op.vals, op.err, w.vals)
					}
				case op.err == nil || !strings.Contains(op.err.Error(), w.err):
					t.Errorf("check %d: %v %v, want an error saying %q", i, op.vals, op.err, w.err)
				case errors.Is(op.err, ErrBadReply) != w.bad:
					t.Errorf("check %d: %v: malformed %v, want %v", i, op.err, !w.bad, w.bad)
				case !w.bad && !isRedisReply(op.err):
					t.Errorf("check %d: %T is not a redis.Error", i, op.err)
				}
			}
		})
	}
}

func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// TestRawReplyErrorLine: an error reply for the whole call never lands in
// the buffer: the writer returns it as a Redis error reply, as go-redis
// would have read it (so NOSCRIPT is retried, READONLY is an outage).
func TestRawReplyErrorLine(t *testing.T) {
	t.Parallel()
	var r rawReply
	_, err := r.Write([]byte("-NOSCRIPT No matching script. Please use EVAL."))
	if !redis.HasErrorPrefix(err, "NOSCRIPT") || len(r.b) != 0 {
		t.Fatalf("NOSCRIPT line: %v, buffer %q", err, r.b)
	}
	_, err = r.Write([]byte("-READONLY You can't write against a read only replica."))
	if KindOf(err) != ErrKindConnection || !IsUnavailable(err) {
		t.Fatalf("READONLY line: %v sorted as %s (outage %v), want connection, outage", err, KindOf(err), IsUnavailable(err))
	}
	for _, p := range []string{"*1", "\r\n", "-ERR inside", "\r\n"} {
		if _, err := r.Write([]byte(p)); err != nil {
			t.Fatalf("%q after the first line: %v", p, err)
		}
	}
	if string(r.b) != "*1\r\n-ERR inside\r\n" {
		t.Fatalf("buffer %q", r.b)
	}
}

// FuzzReadReplies: no reply, however broken, panics the reader, only an
// array is read as the checks' replies, and a call's time read is never
// negative.
func FuzzReadReplies(f *testing.F) {
	for _, s := range []string{
		"*2\r\n*3\r\n:1\r\n:2\r\n:3\r\n-ERR x\r\n",
		"*5\r\n:3\r\n:1\r\n:2\r\n:3\r\n-ERR x\r\n",
		"*1\r\n%2\r\n+a\r\n:1\r\n|1\r\n+b\r\n*1\r\n:2\r\n",
		"*1\r\n$5\r\nab\r\n",
		"*3\r\n*9223372036854775807\r\n",
		"*1\r\n!-5\r\n",
		"*1\r\n*1\r\n:99999999999999999999\r\n",
		// The form since 2026-12-06: the call's TIME last, short replies
		// of status, count, retry, reset.
		"*3\r\n*3\r\n:1\r\n:2\r\n:3\r\n-ERR x\r\n:1796000000000000\r\n",
		"*9\r\n:33\r\n:3\r\n:0\r\n:60000000\r\n:32\r\n:10\r\n:5\r\n:1\r\n:0\r\n",
		"*6\r\n:33\r\n:3\r\n:0\r\n:6\r\n*1\r\n:3\r\n:-1\r\n",
		"*2\r\n:8\r\n:1\r\n",
		"*2\r\n:4\r\n:1\r\n",
	} {
		f.Add([]byte(s), 2)
	}
	f.Fuzz(func(t *testing.T, buf []byte, n int) {
		ops := make([]*batchOp, n&7)
		for i := range ops {
			ops[i] = &batchOp{}
		}
		err := readReplies(buf, ops)
		if err == nil && (len(buf) == 0 || buf[0] != '*') {
			t.Fatalf("%q read as %d replies", buf, len(ops))
		}
		for i, op := range ops {
			if err == nil && op.time < 0 {
				t.Fatalf("%q: check %d has the call's time %d", buf, i, op.time)
			}
		}
	})
}

// TestBatchCtx: a worker's context is done at its batch's deadline, and a
// new batch finds it fresh; a timer of an earlier batch firing late does
// not end the next one.
func TestBatchCtx(t *testing.T) {
	t.Parallel()
	c := newBatchCtx()
	t.Cleanup(c.close)
	var ctx context.Context = c
	deadline := time.Now().Add(20 * time.Millisecond)
	c.start(deadline)
	if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Fatalf("deadline %v %v, want %v", d, ok, deadline)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not done at its deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || time.Now().Before(deadline) {
		t.Fatalf("done with %v at %v, want deadline exceeded at %v", ctx.Err(), time.Now(), deadline)
	}
	c.end()

	c.start(time.Now().Add(time.Hour))
	c.expire() // the last batch's timer, late
	select {
	case <-ctx.Done():
		t.Fatal("the next batch is done from the start")
	default:
	}
	if ctx.Err() != nil {
		t.Fatalf("the next batch: %v", ctx.Err())
	}
	c.end()
	c.start(time.Time{})
	if _, ok := ctx.Deadline(); ok || ctx.Err() != nil {
		t.Fatalf("a batch without a deadline: deadline %v, err %v", ok, ctx.Err())
	}
	c.end()
}

// TestRespInt: the RESP integer reader agrees with strconv.ParseInt on
// every input, the fast path's (a sign, up to 18 digits) and the rest.
func TestRespInt(t *testing.T) {
	t.Parallel()
	cases := []string{"0", "1", "-1", "+7", "42", "-0", "1700000000000000", "999999999999999999", "-999999999999999999",
		"9223372036854775807", "-9223372036854775808", "9223372036854775808", "99999999999999999999",
		"", "-", "+", "--1", "1a", " 1", "1 ", "0x10", "1_000", "+-1", "00012", "-00012"}
	for i := int64(1); i < 1<<62; i *= 7 {
		cases = append(cases, strconv.FormatInt(i, 10), strconv.FormatInt(-i, 10), strconv.FormatInt(i, 10)+"0")
	}
	for _, c := range cases {
		got, gerr := respInt([]byte(c))
		want, werr := strconv.ParseInt(c, 10, 64)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Errorf("respInt(%q) = %d, %v; strconv says %d, %v", c, got, gerr, want, werr)
		}
	}
}

// BenchmarkReadReplies reads a batch's raw reply of 16 admitted
// sliding_log checks (the short form, flat as the fast path appends it:
// 8 × 4 + status, a window's count, retry and reset), then the call's time.
func BenchmarkReadReplies(b *testing.B) {
	var buf []byte
	buf = append(buf, "*65\r\n"...)
	for i := range 16 {
		buf = append(buf, ":33\r\n"...)
		buf = append(buf, ":"+strconv.Itoa(i+1)+"\r\n:0\r\n:59999123\r\n"...)
	}
	buf = append(buf, ":1764700000123456\r\n"...)
	ops := make([]*batchOp, 16)
	for i := range ops {
		ops[i] = &batchOp{vals: make([]int64, 0, 8)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := readReplies(buf, ops); err != nil || ops[15].err != nil {
			b.Fatal(err, ops[15].err)
		}
	}
}
