// Package netproxy is a loopback TCP proxy that delays each direction and
// can cut the path (a black hole) and heal it. Tests and benchmarks put it
// between a client and a server on one machine to play a network between
// them: a Redis in another data centre 10-250 ms away, a path that goes
// dead, a middlebox that drops its state.
//
// # Delay
//
// SetDelay sets a one-way delay per direction. Every chunk the proxy reads
// is stamped with the time it may be delivered (read time + the delay in
// force at the read) and queued; one delivery goroutine per direction and
// connection writes the chunks out in order when they are due. A delay thus
// adds latency, not a throughput limit: many pipelined commands are in
// flight at once, as on a long fat pipe. Order within a connection is kept
// when the delay changes: a chunk is never delivered before one read before
// it, so after the delay is lowered the new bytes wait for the old ones.
// Each direction holds at most 4 MiB in flight per connection; beyond that
// the proxy stops reading from the sender (TCP back-pressure).
//
// # Cut and Heal
//
// Cut makes the path a black hole: connections stay open, new ones are
// still accepted (and dialled to the target), but nothing is delivered in
// either direction, and no one sees a close or a reset. A client's read
// times out; it never gets "connection refused" or EOF.
//
// Bytes are dropped, not held: the proxy goes on reading from both sides
// during a cut (so a sender's writes do not block) and discards what it
// reads, like a dead path drops packets; bytes in flight when the cut began
// are dropped too, at once (they do not hold up the bytes read after a
// Heal). Heal delivers the bytes read after it. Unlike a real TCP path,
// which would retransmit, the dropped bytes are gone for good, so a
// connection that carried data during a cut has a hole in its stream: a
// request with no reply, or a reply with no request. A client that timed out and closed
// its connection (go-redis does so after a read timeout) is not hurt; one
// that keeps using the connection would be confused. Connections that were
// idle during the cut, and connections opened during it that sent nothing,
// work again after Heal.
//
// The end of a stream (a FIN, or the target failing to dial) is not data:
// during a cut it is held and passed on after Heal, so a connection closed
// during a cut ends cleanly once the path is back and nothing is visible
// while it is cut.
//
// # Reset
//
// Reset closes every connection at once, abortively (an RST to both
// sides), like a path that drops its state: a client sees "connection reset
// by peer" (or EOF) on its next read.
//
// # With go-redis
//
// A go-redis command through a cut path fails at the context's deadline
// only with Options.ContextTimeoutEnabled (as the plugin sets it); without
// it the read waits for ReadTimeout (3s by default). The error is the
// socket's "i/o timeout" (it wraps os.ErrDeadlineExceeded and its Timeout()
// is true), not context.DeadlineExceeded itself. go-redis closes a
// connection whose read timed out, so after Heal the next command dials a
// new connection (Stats.Accepted grows by one) and no stream is left with a
// hole; connections idle during the cut are reused as they are.
//
// The proxy listens on 127.0.0.1 only and forwards only to a loopback IP.
package netproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// SetTarget points the connections accepted from now on at target (a
// failover behind one address); connections open now stay where they are
// (Reset closes them).
func (p *Proxy) SetTarget(target string) error {
	if err := checkLoopback(target); err != nil {
		return err
	}
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	return nil
}

// ErrNotLoopback is the error New wraps when the target is not a loopback
// IP address and port.
var ErrNotLoopback = errors.New("target must be a loopback IP address and port, such as 127.0.0.1:6379")

// dialTimeout bounds the proxy's dial of the target for one connection.
const dialTimeout = 5 * time.Second

// Stats are a proxy's counters since New.
type Stats struct {
	Up   int64 // bytes delivered to the target
	Down int64 // bytes delivered to clients

	DroppedUp   int64 // bytes from clients dropped by a cut
	DroppedDown int64 // bytes from the target dropped by a cut

	InFlightUp   int64 // bytes read from clients, not yet delivered nor dropped
	InFlightDown int64 // bytes read from the target, not yet delivered nor dropped

	Accepted int64 // connections accepted
	Open     int   // connections open now (accepted and not yet closed)
}

// Proxy is a loopback TCP proxy; see the package documentation. Its
// methods are safe to call from several goroutines.
type Proxy struct {
	ln     net.Listener
	target string          // under mu
	ctx    context.Context // cancelled by Close: stops dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu        sync.Mutex
	delay     [2]time.Duration // by direction
	cut       bool
	epoch     uint64        // Cuts so far: a chunk read in one epoch is never delivered in another
	healed    chan struct{} // closed by Heal, made anew by Cut
	cutting   chan struct{} // closed by Cut (deliverers drop what is in flight), then made anew
	links     map[*link]struct{}
	closed    bool
	closeErr  error
	closeDone chan struct{} // closed when Close has finished

	bytes    [2]atomic.Int64 // delivered, by direction
	dropped  [2]atomic.Int64 // dropped by a cut, by direction
	inFlight [2]atomic.Int64 // queued, by direction
	accepted atomic.Int64
}

// direction is the way bytes go through the proxy.
type direction int

const (
	upstream   direction = iota // client to target
	downstream                  // target to client
)

// New starts a proxy listening on 127.0.0.1 on a free port that forwards
// every connection to target, which must be a loopback IP and port
// ("127.0.0.1:6379", "[::1]:6379"); anything else is refused with an error
// wrapping ErrNotLoopback. The proxy starts with no delay and the path
// healed. Close it when done.
func New(target string) (*Proxy, error) {
	if err := checkLoopback(target); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netproxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln: ln, target: target, ctx: ctx, cancel: cancel,
		healed: closedChan(), cutting: make(chan struct{}), links: map[*link]struct{}{}, closeDone: make(chan struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// checkLoopback accepts "IP:port" with a loopback IP and a numeric port.
func checkLoopback(target string) error {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("netproxy: target %q: %w: %w", target, ErrNotLoopback, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("netproxy: target %q: %w", target, ErrNotLoopback)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("netproxy: target %q: port %q: %w", target, port, ErrNotLoopback)
	}
	return nil
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Addr returns the address the proxy listens on, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets the one-way delay from client to target (up) and from
// target to client (down); a negative delay counts as 0. A chunk's delay is
// the one in force when the proxy reads it: the change applies to bytes read
// after the call, and bytes already in flight keep theirs (and their order).
func (p *Proxy) SetDelay(up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[upstream], p.delay[downstream] = max(up, 0), max(down, 0)
}

// Cut makes the path a black hole: nothing is delivered in either direction
// until Heal, and what the proxy reads meanwhile, and what was in flight,
// is dropped. Connections stay open and new ones are accepted. A no-op if
// the path is already cut.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		p.cut = true
		p.epoch++
		p.healed = make(chan struct{})
		close(p.cutting)
		p.cutting = make(chan struct{})
	}
}

// Heal ends a cut: bytes read from now on are delivered again, on old
// connections and on those opened during the cut. A no-op if the path is
// not cut.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.healed)
	}
}

// Reset closes every open connection now, with an RST to both the client
// and the target, like a path that drops its state. The proxy goes on
// accepting new connections.
func (p *Proxy) Reset() {
	for _, l := range p.snapshotLinks() {
		l.abort()
	}
}

// Close stops listening, closes every connection and waits until every
// goroutine of the proxy has returned. It returns the listener's close
// error; later calls wait for the first and return the same.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.closeDone
		return p.closeErr
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, l := range p.snapshotLinks() {
		l.close()
	}
	p.wg.Wait()
	p.closeErr = err
	close(p.closeDone)
	return err
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.links)
	p.mu.Unlock()
	return Stats{
		Up: p.bytes[upstream].Load(), Down: p.bytes[downstream].Load(),
		DroppedUp: p.dropped[upstream].Load(), DroppedDown: p.dropped[downstream].Load(),
		InFlightUp: p.inFlight[upstream].Load(), InFlightDown: p.inFlight[downstream].Load(),
		Accepted: p.accepted.Load(), Open: open,
	}
}

func (p *Proxy) snapshotLinks() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	return ls
}

// stamp returns what a chunk read now in direction d gets: its delay and
// the current epoch, or cut=true if it is to be dropped.
func (p *Proxy) stamp(d direction) (delay time.Duration, epoch uint64, cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay[d], p.epoch, p.cut
}

// cutWatch returns a channel closed by the next Cut.
func (p *Proxy) cutWatch() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutting
}

// currentEpoch returns the number of Cuts so far.
func (p *Proxy) currentEpoch() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.epoch
}

// deliverable reports whether a chunk read in epoch may be delivered now:
// the path is not cut and was not cut since the chunk was read.
func (p *Proxy) deliverable(epoch uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.cut && p.epoch == epoch
}

// waitHealed waits until the path is not cut. It returns false if done is
// closed first.
func (p *Proxy) waitHealed(done <-chan struct{}) bool {
	p.mu.Lock()
	healed := p.healed
	p.mu.Unlock()
	select {
	case <-healed:
		return true
	case <-done:
		return false
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // e.g. out of file descriptors: try again shortly
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.accepted.Add(1)
		l := p.register(c)
		if l == nil { // closed meanwhile
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(l)
	}
}

// register records a new connection; nil if the proxy is closed.
func (p *Proxy) register(c net.Conn) *link {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	l := newLink(p, c)
	p.links[l] = struct{}{}
	return l
}

func (p *Proxy) unregister(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// serve dials the target for one accepted connection and runs its two
// directions until both have ended or the connection is closed.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer p.unregister(l)
	d := net.Dialer{Timeout: dialTimeout}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	s, err := d.DialContext(p.ctx, "tcp", target)
	if err != nil {
		// The client sees the close, but not while the path is cut.
		p.waitHealed(l.done)
		return
	}
	if !l.attach(s) {
		return
	}
	up := newPipe(l, upstream, l.client, s)
	down := newPipe(l, downstream, s, l.client)
	var wg sync.WaitGroup
	wg.Go(up.read)
	wg.Go(up.deliver)
	wg.Go(down.read)
	wg.Go(down.deliver)
	wg.Wait()
	up.discard()
	down.discard()
}
