package limiter

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// A batch's reply is read raw: go-redis streams it into a rawReply, which
// its worker reuses from one batch to the next, and readReplies reads the
// values of each check straight from the RESP bytes. Parsed by go-redis,
// the same reply costs an []any per check and a boxed int64 per large value
// (a time, a count): about as many allocations as the rest of a request.

// rawReply receives one reply of a script call from a go-redis
// RawWriteToCmd, which writes it line by line (a line without its CRLF,
// then the CRLF). An error reply (its first line starts with '-') is not
// kept: Write returns it as a redis.Error, so go-redis sees the call fail
// with it exactly as with an error it parsed itself (a READONLY error drops
// the connection; NOSCRIPT reaches the caller, which retries with EVAL).
type rawReply struct{ b []byte }

func (r *rawReply) Write(p []byte) (int, error) {
	if len(r.b) == 0 && len(p) > 0 && p[0] == '-' {
		return 0, replyError(p[1:])
	}
	r.b = append(r.b, p...)
	return len(p), nil
}

// replyError is an error reply from Redis, read from a raw reply. Like the
// errors go-redis reads, it is a redis.Error.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a reply from Redis (redis.Error).
func (replyError) RedisError() {}

// readReplies reads the raw reply of a script call of len(ops) checks: an
// array of, per check in order, either its reply as an array of integers
// (its values, into its vals), or its values as elements of their own, the
// first 8 × their number + the status (the flat form a fast path writes:
// decide.lua's OUT; flatHead), or its error (its own error); a value that is
// not an integer, or any other value where a check's reply begins, makes
// that check's reply malformed, for that check alone; then, last, the
// call's reading of Redis TIME (an integer, 0 for none), into every check's
// time. The error is for a reply that cannot be read as that (not an
// array, a count past its end, too few or too many elements, no TIME): the
// whole call failed.
func readReplies(buf []byte, ops []*batchOp) error {
	r := respReader{buf: buf}
	if r.at('!') {
		// RESP3's blob error (RESP2 has only the '-' lines rawReply returns).
		if msg, ok := r.blob(); ok {
			return replyError(msg)
		}
	}
	typ, n, ok := r.header()
	if !ok || typ != '*' || n < 0 {
		r.pos = 0
		return fmt.Errorf("%w: %s for %d checks", ErrBadReply, r.describe(), len(ops))
	}
	left := n - 1 // the last is the call's TIME
	for i, op := range ops {
		if left <= 0 {
			return fmt.Errorf("%w: %d values for %d checks and the time, none for check %d", ErrBadReply, n, len(ops), i)
		}
		var err error
		op.vals, op.err, left, err = r.check(op.vals[:0], left)
		if err != nil {
			return fmt.Errorf("%w: check %d: %w", ErrBadReply, i, err)
		}
	}
	if left != 0 {
		return fmt.Errorf("%w: %d values left after %d checks and the time", ErrBadReply, left, len(ops))
	}
	typ, t, ok := r.header()
	if !ok || typ != ':' || t < 0 {
		return fmt.Errorf("%w: the call's time is not a whole number of µs", ErrBadReply)
	}
	for _, op := range ops {
		op.time = t
	}
	return nil
}

// respReader reads RESP values from buf.
type respReader struct {
	buf []byte
	pos int
}

// at reports whether the next value is of type typ.
func (r *respReader) at(typ byte) bool { return r.pos < len(r.buf) && r.buf[r.pos] == typ }

// line is the next line, without its CRLF.
func (r *respReader) line() ([]byte, bool) {
	i := bytes.IndexByte(r.buf[r.pos:], '\n')
	if i < 2 || r.buf[r.pos+i-1] != '\r' {
		return nil, false
	}
	l := r.buf[r.pos : r.pos+i-1]
	r.pos += i + 1
	return l, true
}

// header reads the next line as a type and a number (a length, a count, an
// integer).
func (r *respReader) header() (typ byte, n int64, ok bool) {
	l, ok := r.line()
	if !ok {
		return 0, 0, false
	}
	n, err := respInt(l[1:])
	return l[0], n, err == nil
}

// blob reads a length-prefixed string (the next value's header is its
// length). When there is none, it reads nothing.
func (r *respReader) blob() (string, bool) {
	start := r.pos
	_, n, ok := r.header()
	if !ok || n < 0 || n > int64(len(r.buf)-r.pos-2) {
		r.pos = start
		return "", false
	}
	end := r.pos + int(n)
	if r.buf[end] != '\r' || r.buf[end+1] != '\n' {
		r.pos = start
		return "", false
	}
	s := string(r.buf[r.pos:end])
	r.pos = end + 2
	return s, true
}

// check reads one check's reply (an array, or flat: 8 × n + status and
// n - 1 values, or an error) from a call's reply of which left elements
// are still to be read: its values appended to vals, or its error; it
// returns how many elements are left after it. err is for a reply that
// cannot be read on (cut short, or a count past its end): nothing after it
// can be read.
func (r *respReader) check(vals []int64, left int64) (_ []int64, _ error, _ int64, err error) {
	if r.at('!') {
		if msg, ok := r.blob(); ok {
			return nil, replyError(msg), left - 1, nil
		}
	}
	start := r.pos
	l, ok := r.line()
	if !ok {
		return nil, nil, 0, errors.New("cut short")
	}
	switch l[0] {
	case '-':
		return nil, replyError(l[1:]), left - 1, nil
	case '*', ':':
		n, err := respInt(l[1:])
		if err != nil || n < 0 {
			break
		}
		first := int64(0) // the index of the first value read below
		if l[0] == ':' {
			var status int64
			if n, status, err = flatHead(n); err != nil || n > left {
				break
			}
			vals = append(vals, status)
			n, first = n-1, 1 // the values after the first
			left -= n
		}
		left-- // the array, or the flat reply's first
		var bad error
		for i := range n {
			at := r.pos
			typ, v, ok := r.header()
			if ok && typ == ':' {
				vals = append(vals, v)
				continue
			}
			r.pos = at
			if bad == nil {
				bad = fmt.Errorf("%w: value %d is %s", ErrBadReply, first+i, r.describe())
			}
			if !r.skip() {
				return nil, nil, 0, errors.New("cut short")
			}
		}
		if bad != nil {
			return nil, bad, left, nil
		}
		return vals, nil, left, nil
	}
	r.pos = start
	if l[0] == ':' {
		return nil, nil, 0, fmt.Errorf("a flat reply's first value %s (8 × its values + its status) where %d values are left", l[1:], left)
	}
	bad := fmt.Errorf("%w: %s", ErrBadReply, r.describe())
	if !r.skip() {
		return nil, nil, 0, errors.New("cut short")
	}
	return nil, bad, left - 1, nil
}

// describe names the value at the reader's position, for an error.
func (r *respReader) describe() string {
	if r.pos >= len(r.buf) {
		return "nothing"
	}
	if rest := r.buf[r.pos+1:]; bytes.HasPrefix(rest, []byte("-1\r\n")) && bytes.IndexByte([]byte("$*"), r.buf[r.pos]) >= 0 {
		return "nil" // RESP2's nil string or array
	}
	switch r.buf[r.pos] {
	case '+':
		return "a status"
	case '-', '!':
		return "an error"
	case ':':
		return "an integer"
	case '$', '=':
		return "a string"
	case '*', '~', '>':
		return "an array"
	case '%':
		return "a map"
	case '_':
		return "nil"
	case ',':
		return "a double"
	case '#':
		return "a boolean"
	case '(':
		return "a big number"
	}
	return fmt.Sprintf("a value of type %q", r.buf[r.pos])
}

// skip passes over the next value, whatever its type. It reports whether
// the value was whole.
func (r *respReader) skip() bool {
	start := r.pos
	l, ok := r.line()
	if !ok {
		return false
	}
	switch l[0] {
	case '$', '=', '!':
		if bytes.Equal(l[1:], []byte("-1")) {
			return true // RESP2's nil string
		}
		r.pos = start
		_, ok := r.blob()
		return ok
	case '*', '~', '>', '%', '|':
		n, err := respInt(l[1:])
		if err != nil || n > int64(len(r.buf)) {
			return false
		}
		if l[0] == '%' || l[0] == '|' {
			n *= 2
		}
		for range n { // none for -1, RESP2's nil array
			if !r.skip() {
				return false
			}
		}
		if l[0] == '|' {
			// An attribute comes before the value it describes.
			return r.skip()
		}
	}
	return true // a value of one line
}

// flatHead reads the first value of a flat reply (decide.lua's OUT): 8 ×
// n + status, n its number of values (the status included, so at least 1),
// status from 0 to 7.
func flatHead(x int64) (n, status int64, err error) {
	if x < 8 {
		return 0, 0, fmt.Errorf("a flat reply's first value %d", x)
	}
	return x >> 3, x & 7, nil
}

// respInt is strconv.ParseInt(string(b), 10, 64) without the conversion
// and, for the integers RESP replies carry (a sign and up to 18 digits),
// without its general path: a batch's reply is a few such lines per check.
// Anything else goes to strconv, so the two agree on every input.
func respInt(b []byte) (int64, error) {
	d := b
	neg := len(d) > 0 && d[0] == '-'
	if neg || len(d) > 0 && d[0] == '+' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 {
		return strconv.ParseInt(string(b), 10, 64)
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return strconv.ParseInt(string(b), 10, 64)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}
