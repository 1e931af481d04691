package netproxy_test

import (
	"fmt"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/netproxy"
)

// A Redis 20ms away each way that goes dead for a while and comes back.
// (Compiled, not run: it needs a server at the target.)
func Example() {
	p, err := netproxy.New("127.0.0.1:6390") // the address of a test's redis-server
	if err != nil {
		panic(err)
	}
	defer p.Close()
	p.SetDelay(20*time.Millisecond, 20*time.Millisecond)
	// Point the client at p.Addr() instead of the server's address.
	fmt.Println("client dials", p.Addr())

	p.Cut() // commands now time out; connections stay open
	p.Heal()
	p.Reset() // every connection is reset; clients dial again
	st := p.Stats()
	fmt.Println(st.Accepted, "connections,", st.Up, "bytes up,", st.Down, "bytes down")
}
