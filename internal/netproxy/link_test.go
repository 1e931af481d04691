package netproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOrderKeptWhenDelayDrops: records written while the delay is 200ms,
// then after it drops to 0, come out in the order written (the later ones
// wait for the earlier ones).
func TestOrderKeptWhenDelayDrops(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	p.SetDelay(200*time.Millisecond, 0)
	c := dial(t, p.Addr())
	const n = 400
	got := make(chan error, 1)
	go func() { got <- readRecords(c, n) }()
	rec := make([]byte, 8)
	for i := range n {
		if i == n/2 { // the first half is in flight, due in 200ms
			waitFor(t, "read by the proxy", func() bool { st := p.Stats(); return st.InFlightUp+st.Up == 8*n/2 })
			p.SetDelay(0, 0)
		}
		binary.BigEndian.PutUint64(rec, uint64(i))
		if _, err := c.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// readRecords reads n 8-byte big-endian records from c and checks they are
// 0, 1, ..., n-1.
func readRecords(c net.Conn, n int) error {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 8*n)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	for i := range n {
		if v := binary.BigEndian.Uint64(buf[8*i:]); v != uint64(i) {
			return fmt.Errorf("record %d is %d: out of order", i, v)
		}
	}
	return nil
}

// TestThroughputWithDelay: a 50ms delay each way adds latency, not a
// throughput cap: 8 MiB echo through it in well under 5s (a sleep of 50ms
// per 32 KiB read would need 12.8s each way).
func TestThroughputWithDelay(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	p.SetDelay(50*time.Millisecond, 50*time.Millisecond)
	c := dial(t, p.Addr())
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		sent <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if !bytes.Equal(got, data) {
		t.Fatal("the echo differs from what was sent")
	}
	if elapsed < 100*time.Millisecond || elapsed > 5*time.Second {
		t.Fatalf("8 MiB round trip with 50ms each way took %v, want at least 100ms and under 5s", elapsed)
	}
	if st := p.Stats(); st.Up != int64(len(data)) || st.Down != int64(len(data)) {
		t.Fatalf("Stats = %+v, want %d bytes each way", st, len(data))
	}
}

// TestHalfClose: a client's FIN is passed on after its data (with the
// delay), and the target's answer and FIN come back.
func TestHalfClose(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	p.SetDelay(20*time.Millisecond, 10*time.Millisecond)
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("read %q, %v; want \"last words\" and EOF", got, err)
	}
	waitFor(t, "closed", func() bool { return p.Stats().Open == 0 })
}

// TestConcurrent, for -race: clients echo random payloads while the delay
// changes and Stats is read; every byte comes back intact and is counted.
// Then Cut, Heal and Reset race with new connections and Close.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	p, err := New(startEcho(t))
	if err != nil {
		t.Fatal(err)
	}
	const clients, rounds = 12, 30
	var sent atomic.Int64
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			d := time.Duration(i%3) * time.Millisecond
			p.SetDelay(d, 2*time.Millisecond-d)
			_ = p.Stats()
		}
	})
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { errs <- echoRounds(p.Addr(), uint64(i), rounds, &sent) })
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if st := p.Stats(); st.Up != sent.Load() || st.Down != sent.Load() || st.Accepted != clients {
		t.Errorf("Stats = %+v, want %d bytes each way and %d accepted", st, sent.Load(), clients)
	}
	chaos(t, p)
}

// echoRounds opens a connection to addr and echoes rounds random payloads
// (1 B to 64 KiB) through it, adding their sizes to sent.
func echoRounds(addr string, seed uint64, rounds int, sent *atomic.Int64) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(seed, 1))
	for r := range rounds {
		msg := make([]byte, 1+rng.IntN(64<<10))
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		if err := echo(c, msg); err != nil {
			return fmt.Errorf("client %d round %d (%d bytes): %w", seed, r, len(msg), err)
		}
		sent.Add(int64(len(msg)))
	}
	return nil
}

// chaos runs Cut, Heal and Reset against clients that connect, write and
// read with short deadlines, then closes p while they are at it. Errors of
// the clients are expected; a race, a panic or a hang is not.
func chaos(t *testing.T, p *Proxy) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
				if err != nil {
					continue // refused once p is closed
				}
				_ = echo(c, make([]byte, 512))
				_ = c.SetDeadline(time.Now().Add(5 * time.Millisecond))
				_, _ = c.Write([]byte("x"))
				_, _ = c.Read(make([]byte, 1))
				_ = c.Close()
			}
		})
	}
	for i := range 60 {
		switch i % 3 {
		case 0:
			p.Cut()
		case 1:
			p.Heal()
		case 2:
			p.Reset()
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Errorf("Close: %v", err)
	}
	close(stop)
	wg.Wait()
	if st := p.Stats(); st.Open != 0 || st.InFlightUp != 0 || st.InFlightDown != 0 {
		t.Errorf("Stats after Close = %+v, want nothing open or in flight", st)
	}
}

// TestBackPressure: a connection holds at most about 4 MiB in flight per
// direction; beyond that the proxy stops reading and the sender's writes
// block, as on a full TCP window.
func TestBackPressure(t *testing.T) {
	t.Parallel()
	p := newProxy(t, startEcho(t))
	p.SetDelay(time.Minute, 0)
	c := dial(t, p.Addr())
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20))
		wrote <- err
	}()
	waitFor(t, "4 MiB in flight", func() bool { return p.Stats().InFlightUp >= maxQueued })
	select {
	case err := <-wrote:
		t.Fatalf("a 64 MiB write through a full proxy returned (%v), want it blocked", err)
	case <-time.After(50 * time.Millisecond):
	}
	if st := p.Stats(); st.InFlightUp > maxQueued+readSize {
		t.Fatalf("%d bytes in flight, want at most %d", st.InFlightUp, maxQueued+readSize)
	}
	_ = c.Close()
	if err := <-wrote; err == nil {
		t.Fatal("the blocked write succeeded after Close")
	}
}
