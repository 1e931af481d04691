package netproxy

import (
	"io"
	"net"
	"testing"
)

// BenchmarkRoundTrip is the cost the proxy adds to a small request and
// reply with no delay, beside the same echo without it.
func BenchmarkRoundTrip(b *testing.B) {
	for _, via := range []string{"direct", "proxy"} {
		b.Run(via, func(b *testing.B) {
			addr := startEcho(b)
			if via == "proxy" {
				addr = newProxy(b, addr).Addr()
			}
			c := dial(b, addr)
			msg := make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				if err := echo(c, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkThroughput streams data one way through the proxy, no delay.
func BenchmarkThroughput(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, s)
		_ = s.Close()
	}()
	p := newProxy(b, ln.Addr().String())
	c := dial(b, p.Addr())
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	_ = c.Close()
	<-done
	_ = ln.Close()
}
