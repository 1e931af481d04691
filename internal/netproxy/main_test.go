package netproxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once every test is done
// (a proxy's, an echo server's, go-redis's or redistest's).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
