package slidingratelimit

import (
	"crypto/sha1"
	"encoding/hex"
	"net"
	"sync"
	"testing"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// scriptSHA is the EVALSHA digest of the sliding_log script.
func scriptSHA(t *testing.T, _ *redistest.Server) string {
	t.Helper()
	sum := sha1.Sum([]byte(lua.SlidingLog))
	return hex.EncodeToString(sum[:])
}

// newBlackHole listens on loopback, accepts connections and never answers,
// like a Redis that hangs. It is closed at the end of the test.
func newBlackHole(t *testing.T) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), nil
}
