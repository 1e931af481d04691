package netproxy

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestNewRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, target := range []string{"127.0.0.1:1", "127.8.9.10:65535", "[::1]:1"} {
		t.Run("accepts "+target, func(t *testing.T) {
			t.Parallel()
			p := newProxy(t, target)
			if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || strings.HasSuffix(p.Addr(), ":0") {
				t.Fatalf("Addr() = %q, want 127.0.0.1 and a port", p.Addr())
			}
		})
	}
	for _, target := range []string{
		"10.0.0.1:6379", "192.168.1.1:6379", "0.0.0.0:6379", "[::]:6379", ":6379",
		"localhost:6379", "example.com:6379", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:redis", "127.0.0.1:70000", "",
	} {
		t.Run("refuses "+target, func(t *testing.T) {
			t.Parallel()
			p, err := New(target)
			if err == nil {
				_ = p.Close()
				t.Fatalf("New(%q) succeeded", target)
			}
			if !errors.Is(err, ErrNotLoopback) {
				t.Fatalf("New(%q): %v, want it to wrap ErrNotLoopback", target, err)
			}
		})
	}
}

// TestDelayRoundTrip: a round trip through an echo server takes at least
// the two one-way delays. (The upper bound only catches a runaway, e.g. a
// delay per byte: 10x, and never under 2s.)
func TestDelayRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		up, down time.Duration
	}{
		{"none", 0, 0},
		{"symmetric", 25 * time.Millisecond, 25 * time.Millisecond},
		{"up only", 40 * time.Millisecond, 0},
		{"down only", 0, 40 * time.Millisecond},
		{"asymmetric", 10 * time.Millisecond, 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProxy(t, startEcho(t))
			p.SetDelay(tc.up, tc.down)
			c := dial(t, p.Addr())
			lower := tc.up + tc.down
			upper := max(10*lower, 2*time.Second)
			for i := range 3 {
				start := time.Now()
				if err := echo(c, []byte("ping "+strings.Repeat("x", i*1000))); err != nil {
					t.Fatal(err)
				}
				if rtt := time.Since(start); rtt < lower || rtt > upper {
					t.Fatalf("round trip %d took %v, want at least %v (up %v + down %v) and under %v", i, rtt, lower, tc.up, tc.down, upper)
				}
			}
		})
	}
}

// TestDelayChangeAppliesToLaterBytes: bytes read after SetDelay get the
// new delay, in both directions.
func TestDelayChangeAppliesToLaterBytes(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	if err := echo(c, []byte("fast")); err != nil {
		t.Fatal(err)
	}
	p.SetDelay(30*time.Millisecond, 40*time.Millisecond)
	start := time.Now()
	if err := echo(c, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 70*time.Millisecond {
		t.Fatalf("round trip after SetDelay(30ms, 40ms) took %v, want at least 70ms", rtt)
	}
}

// TestCutBlackHole: while cut, a read on an open connection times out
// (no EOF, no reset), new connections are accepted and time out the same;
// after Heal both carry new bytes, and what was sent during the cut is gone.
func TestCutBlackHole(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	old := dial(t, p.Addr())
	if err := echo(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := old.Write([]byte("lost")); err != nil {
		t.Fatalf("write during a cut: %v", err)
	}
	readTimesOut(t, old, 200*time.Millisecond)
	opened := dial(t, p.Addr()) // accepted during the cut
	if _, err := opened.Write([]byte("lost too")); err != nil {
		t.Fatalf("write during a cut: %v", err)
	}
	readTimesOut(t, opened, 100*time.Millisecond)
	// The proxy reads what was sent in its own time (on a busy machine,
	// later than the read above gave up): the bytes are dropped when it
	// does, never delivered (below, after Heal, nothing of them comes).
	want := int64(len("lost") + len("lost too"))
	for deadline := time.Now().Add(5 * time.Second); ; {
		st := p.Stats()
		if st.Open == 2 && st.DroppedUp == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats during the cut = %+v, want 2 open and the %d bytes sent dropped", st, want)
		}
		time.Sleep(5 * time.Millisecond) // polling the proxy's counters
	}

	p.Heal()
	for name, c := range map[string]net.Conn{"old": old, "opened during the cut": opened} {
		if err := echo(c, []byte("after")); err != nil {
			t.Fatalf("%s connection after Heal: %v", name, err)
		}
		readTimesOut(t, c, 50*time.Millisecond) // and nothing of the cut came after it
	}
}

// TestCutDropsBytesInFlight: bytes read before a Cut but not yet delivered
// are dropped, and they do not hold up what is sent after Heal.
func TestCutDropsBytesInFlight(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	p.SetDelay(time.Minute, 0)
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "in flight", func() bool { return p.Stats().InFlightUp == 4 })
	p.Cut()
	waitFor(t, "dropped", func() bool { st := p.Stats(); return st.DroppedUp == 4 && st.InFlightUp == 0 })
	p.Heal()
	p.SetDelay(0, 0)
	if err := echo(c, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Up != 4 || st.Down != 4 {
		t.Fatalf("Stats = %+v, want 4 bytes delivered each way (only \"kept\")", st)
	}
}

// TestCutHoldsTheClose: a client's close during a cut does not reach the
// target until Heal, and a target's close does not reach the client.
func TestCutHoldsTheClose(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	sawEOF := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			sawEOF <- err
			return
		}
		defer s.Close()
		_, err = io.Copy(io.Discard, s)
		sawEOF <- err
	}()
	p := newProxy(t, ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "delivered", func() bool { return p.Stats().Up == 5 })
	p.Cut()
	_ = c.Close()
	select {
	case err := <-sawEOF:
		t.Fatalf("the target saw the client's close during a cut (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	p.Heal()
	select {
	case err := <-sawEOF:
		if err != nil {
			t.Fatalf("target: %v, want a clean EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the target never saw the client's close after Heal")
	}
	waitFor(t, "closed", func() bool { return p.Stats().Open == 0 })
}

// TestCutHidesAFailedDial: a target that refuses the proxy's dial shows as
// a closed connection, but not while the path is cut.
func TestCutHidesAFailedDial(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	p := newProxy(t, dead)

	c := dial(t, p.Addr())
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a proxy to a dead target: %v, want the connection closed", err)
	}

	p.Cut()
	c = dial(t, p.Addr())
	readTimesOut(t, c, 200*time.Millisecond)
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Heal: %v, want the connection closed", err)
	}
}

// TestReset: Reset closes every connection at once (the client's read
// fails, it does not time out); the proxy takes new connections.
func TestReset(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	p.SetDelay(5*time.Millisecond, 5*time.Millisecond)
	conns := []net.Conn{dial(t, p.Addr()), dial(t, p.Addr())}
	for _, c := range conns {
		if err := echo(c, []byte("hi")); err != nil {
			t.Fatal(err)
		}
	}
	p.Reset()
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(make([]byte, 1))
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d after Reset: read %d, %v; want it closed", i, n, err)
		}
	}
	waitFor(t, "all closed", func() bool { return p.Stats().Open == 0 })
	if err := echo(dial(t, p.Addr()), []byte("new")); err != nil {
		t.Fatalf("new connection after Reset: %v", err)
	}
	if st := p.Stats(); st.Accepted != 3 || st.Open != 1 {
		t.Fatalf("Stats = %+v, want 3 accepted, 1 open", st)
	}
}

// TestCloseLeavesNothing: Close, with connections busy, cut, half-closed
// and idle, returns after every goroutine of the proxy has; the listener
// is gone and the clients see their connections closed. Not parallel:
// goleak looks at the whole process.
func TestCloseLeavesNothing(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	exits := exitLines(t, "proxy.go", "serve", "acceptLoop") // before Close: looking is quick
	t.Run("traffic", func(t *testing.T) {
		p, err := New(startEcho(t))
		if err != nil {
			t.Fatal(err)
		}
		p.SetDelay(time.Minute, 0) // bytes sit in flight
		busy, idle, half := dial(t, p.Addr()), dial(t, p.Addr()), dial(t, p.Addr())
		if _, err := busy.Write(make([]byte, 100<<10)); err != nil {
			t.Fatal(err)
		}
		_ = half.(*net.TCPConn).CloseWrite()
		p.Cut()
		cut := dial(t, p.Addr())
		_ = cut.Close() // its close is held by the cut
		waitFor(t, "accepted", func() bool { return p.Stats().Accepted == 4 })

		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if left := proxyWorking(exits); len(left) > 0 {
			t.Fatalf("Close returned with %d goroutines of the proxy still running:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		// Those past their wg.Done (runnable in serve or acceptLoop
		// themselves, calling nothing) are gone moments later.
		waitFor(t, "all the proxy's goroutines gone", func() bool { return len(proxyGoroutines()) == 0 })
		if err := p.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		for _, c := range []net.Conn{busy, idle, half} {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after Close: %v, want the connection closed", err)
			}
		}
		if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
			_ = c.Close()
			t.Fatal("the proxy still accepts connections after Close")
		}
	})
	goleak.VerifyNone(t, ignore)
}

// proxyWorking is proxyGoroutines without those that have done their
// work: a goroutine's wg.Done is its last deferred call, so right after
// Close's wg.Wait a goroutine may still be runnable in serve or
// acceptLoop, calling nothing, at a line where the function returns (a
// return statement or its closing brace), on its way out. Any other
// goroutine of the proxy (blocked, inside a call, or runnable mid-body)
// is one Close did not wait for.
func proxyWorking(exits map[string]bool) []string {
	var left []string
	for _, g := range proxyGoroutines() {
		lines := strings.SplitN(g, "\n", 4)
		if len(lines) >= 3 && strings.HasSuffix(lines[0], "[runnable]:") && exiting(exits, lines[1], lines[2]) {
			continue
		}
		left = append(left, g)
	}
	return left
}

// exiting: the top frame (its function line, then its "\tfile:line +pc"
// line) is one of exits in proxy.go.
func exiting(exits map[string]bool, fn, at string) bool {
	file, rest, ok := strings.Cut(strings.TrimSpace(at), ":")
	if !ok || !strings.HasSuffix(file, "/proxy.go") {
		return false
	}
	line, _, _ := strings.Cut(rest, " ")
	for exit := range exits {
		name, l, _ := strings.Cut(exit, ":")
		if l == line && strings.Contains(fn, "netproxy.(*Proxy)."+name+"(") {
			return true
		}
	}
	return false
}

// exitLines gives, for each named method in file, "name:line" of every line
// it returns at: its return statements (not those of function literals
// inside it) and its closing brace.
func exitLines(t *testing.T, file string, names ...string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	exits := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv == nil || !slices.Contains(names, fd.Name.Name) {
			continue
		}
		add := func(p token.Pos) { exits[fmt.Sprintf("%s:%d", fd.Name.Name, fset.Position(p).Line)] = true }
		add(fd.Body.Rbrace)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false
			case *ast.ReturnStmt:
				add(n.Pos())
			}
			return true
		})
	}
	if len(exits) < len(names) {
		t.Fatalf("%s: found %d of the methods %v", file, len(exits), names)
	}
	return exits
}

// proxyGoroutines returns the stacks of the goroutines running a method of
// Proxy or pipe (the accept loop, serve, read, deliver), at once, without
// waiting for them to end.
func proxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "netproxy.(*Proxy).") || strings.Contains(g, "netproxy.(*pipe).") {
			left = append(left, g)
		}
	}
	return left
}
