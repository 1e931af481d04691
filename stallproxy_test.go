package slidingratelimit

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallProxy: a loopback TCP proxy in front of a Redis that can be switched
// to stall: it keeps reading from both sides but holds every byte until it
// is switched back, like a network path that stops delivering. Close (a
// test cleanup) closes every connection and waits for its goroutines.

type stallProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64

	mu      sync.Mutex
	stalled bool
	release chan struct{} // closed when a stall ends
	conns   map[net.Conn]struct{}
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's 127.0.0.1 address.
func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// Stall switches holding bytes on or off; switching it off delivers what
// was held.
func (p *stallProxy) Stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && !p.stalled:
		p.stalled, p.release = true, make(chan struct{})
	case !on && p.stalled:
		p.stalled = false
		close(p.release)
	}
}

// Close stops the proxy: listener, connections, goroutines.
func (p *stallProxy) Close() {
	p.once.Do(func() {
		close(p.closed)
		_ = p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// track registers a connection pair, or closes it if the proxy is closed.
func (p *stallProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	default:
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *stallProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// pass blocks while the proxy is stalled; false if it closed meanwhile.
func (p *stallProxy) pass() bool {
	p.mu.Lock()
	stalled, release := p.stalled, p.release
	p.mu.Unlock()
	if !stalled {
		return true
	}
	select {
	case <-release:
		return true
	case <-p.closed:
		return false
	}
}

// pipe copies src to dst, holding bytes while stalled; when either side
// ends, both connections are closed (which ends the other pipe too).
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
