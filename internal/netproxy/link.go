package netproxy

import (
	"net"
	"sync"
	"time"
)

const (
	readSize  = 32 << 10 // bytes read at most per chunk
	maxQueued = 4 << 20  // bytes in flight per direction and connection before reading stops
)

// link is one proxied connection: the client's side, accepted, and the
// target's, dialled.
type link struct {
	p      *Proxy
	client net.Conn
	done   chan struct{} // closed by close: every goroutine of the link returns

	mu     sync.Mutex
	server net.Conn // nil until attached
	closed bool
}

func newLink(p *Proxy, c net.Conn) *link {
	return &link{p: p, client: c, done: make(chan struct{})}
}

// attach sets the target's side; false (and s closed) if the link was
// closed during the dial.
func (l *link) attach(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = s.Close()
		return false
	}
	l.server = s
	return true
}

// close closes both sides and ends the link's goroutines; later calls do
// nothing.
func (l *link) close() { l.shut(false) }

// abort is close with an RST instead of a FIN to both sides.
func (l *link) abort() { l.shut(true) }

func (l *link) shut(rst bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.done)
	for _, c := range []net.Conn{l.client, l.server} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// chunk is a piece of one direction's stream in flight.
type chunk struct {
	data  []byte    // nil: the end of the stream (the sender closed, or its side failed)
	due   time.Time // when it may be delivered
	epoch uint64    // the proxy's cut epoch when it was read
}

// pipe is one direction of a link: read copies what src sends into a
// queue of timestamped chunks, deliver writes them to dst when due, in
// order.
type pipe struct {
	l        *link
	dir      direction
	src, dst net.Conn

	mu     sync.Mutex
	q      []chunk
	queued int           // data bytes in q
	wake   chan struct{} // cap 1: q has a new chunk
	room   chan struct{} // cap 1: queued went down
}

func newPipe(l *link, dir direction, src, dst net.Conn) *pipe {
	return &pipe{l: l, dir: dir, src: src, dst: dst, wake: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// read reads src until it fails or ends, queueing what it reads (or
// dropping it during a cut), then queues the end of the stream.
func (pp *pipe) read() {
	buf := make([]byte, readSize)
	for {
		n, err := pp.src.Read(buf)
		if n > 0 {
			pp.push(buf[:n])
			if !pp.waitRoom() {
				return
			}
		}
		if err != nil {
			pp.enqueue(chunk{due: pp.stampEnd()})
			return
		}
	}
}

// push stamps a copy of b and queues it, or drops b if the path is cut.
func (pp *pipe) push(b []byte) {
	delay, epoch, cut := pp.l.p.stamp(pp.dir)
	if cut {
		pp.l.p.dropped[pp.dir].Add(int64(len(b)))
		return
	}
	pp.enqueue(chunk{data: append([]byte(nil), b...), due: time.Now().Add(delay), epoch: epoch})
}

// stampEnd is when the end of the stream is due: after the delay, like data.
func (pp *pipe) stampEnd() time.Time {
	delay, _, _ := pp.l.p.stamp(pp.dir)
	return time.Now().Add(delay)
}

func (pp *pipe) enqueue(c chunk) {
	pp.mu.Lock()
	pp.q = append(pp.q, c)
	pp.queued += len(c.data)
	pp.l.p.inFlight[pp.dir].Add(int64(len(c.data)))
	pp.mu.Unlock()
	signal(pp.wake)
}

// waitRoom waits until the queue holds at most maxQueued bytes; false if
// the link is closed first.
func (pp *pipe) waitRoom() bool {
	for {
		pp.mu.Lock()
		ok := pp.queued <= maxQueued
		pp.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-pp.room:
		case <-pp.l.done:
			return false
		}
	}
}

// deliver writes the queued chunks to dst as they fall due, until the end
// of the stream (then it half-closes dst) or the link is closed. A Cut
// wakes it to drop what is in flight at once, so that dropped bytes do not
// hold up those read after Heal.
func (pp *pipe) deliver() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		cutting := pp.l.p.cutWatch()
		head, ok := pp.head()
		if !ok || !pp.sleepUntil(timer, head.due, cutting) {
			return
		}
		now := time.Now()
		if now.Before(head.due) {
			continue // woken by a cut
		}
		if head.data == nil {
			pp.finish()
			return
		}
		bufs, n := pp.popDue(now)
		if len(bufs) == 0 {
			continue // all dropped by a cut
		}
		// Counted first, so a reader that has the bytes sees them counted.
		pp.l.p.bytes[pp.dir].Add(int64(n))
		if written, err := bufs.WriteTo(pp.dst); err != nil {
			pp.l.p.bytes[pp.dir].Add(written - int64(n))
			pp.l.close()
			return
		}
	}
}

// head drops the data chunks at the front of the queue read before the
// last Cut and waits for the first chunk left, without removing it; false
// if the link is closed first.
func (pp *pipe) head() (chunk, bool) {
	for {
		epoch := pp.l.p.currentEpoch()
		pp.mu.Lock()
		k, n := 0, 0
		for k < len(pp.q) && pp.q[k].data != nil && pp.q[k].epoch < epoch {
			n += len(pp.q[k].data)
			k++
		}
		pp.removeLocked(k, n)
		var c chunk
		ok := len(pp.q) > 0
		if ok {
			c = pp.q[0]
		}
		pp.mu.Unlock()
		if n > 0 {
			pp.l.p.dropped[pp.dir].Add(int64(n))
			signal(pp.room)
		}
		if ok {
			return c, true
		}
		select {
		case <-pp.wake:
		case <-pp.l.done:
			return chunk{}, false
		}
	}
}

// removeLocked removes the first k chunks, of n data bytes, from the queue.
func (pp *pipe) removeLocked(k, n int) {
	if k == 0 {
		return
	}
	clear(pp.q[:k]) // the backing array must not keep removed data alive
	pp.q = pp.q[k:]
	pp.queued -= n
	pp.l.p.inFlight[pp.dir].Add(-int64(n))
}

// sleepUntil waits until t or a cut; false if the link is closed first.
func (pp *pipe) sleepUntil(timer *time.Timer, t time.Time, cutting <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer.Reset(d)
	select {
	case <-timer.C:
	case <-cutting:
	case <-pp.l.done:
		return false
	}
	return true
}

// popDue removes the data chunks at the front of the queue that are due at
// now, up to the end of the stream, and returns those the path may deliver
// (the others are counted as dropped) with their total size.
func (pp *pipe) popDue(now time.Time) (net.Buffers, int) {
	pp.mu.Lock()
	k, size := 0, 0
	for k < len(pp.q) && pp.q[k].data != nil && !pp.q[k].due.After(now) {
		size += len(pp.q[k].data)
		k++
	}
	taken := append([]chunk(nil), pp.q[:k]...)
	pp.removeLocked(k, size)
	pp.mu.Unlock()
	signal(pp.room)

	var bufs net.Buffers
	n := 0
	for _, c := range taken {
		if !pp.l.p.deliverable(c.epoch) {
			pp.l.p.dropped[pp.dir].Add(int64(len(c.data)))
			continue
		}
		bufs = append(bufs, c.data)
		n += len(c.data)
	}
	return bufs, n
}

// discard forgets what is still queued when the link has ended (it was
// neither delivered nor dropped by a cut: the connection is gone).
func (pp *pipe) discard() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.removeLocked(len(pp.q), pp.queued)
}

// finish passes the end of the stream on, once the path is not cut: dst is
// half-closed (its reader sees EOF) or, if it cannot be, closed with the
// link.
func (pp *pipe) finish() {
	if !pp.l.p.waitHealed(pp.l.done) {
		return
	}
	if tc, ok := pp.dst.(*net.TCPConn); ok && tc.CloseWrite() == nil {
		return
	}
	pp.l.close()
}
