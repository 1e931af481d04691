package limiter

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrKind sorts a store error into a fixed vocabulary (the store_errors
// metric's kind label).
type ErrKind string

// The error kinds.
const (
	ErrKindNone        ErrKind = ""
	ErrKindTimeout     ErrKind = "timeout"      // the call ran out of time (or reached Redis after its deadline)
	ErrKindCircuitOpen ErrKind = "circuit_open" // the breaker did not call the store
	ErrKindConnection  ErrKind = "connection"   // Redis unreachable, or it says it cannot serve (LOADING, READONLY, OOM, ...)
	ErrKindAuth        ErrKind = "auth"         // WRONGPASS, NOAUTH, NOPERM
	ErrKindScript      ErrKind = "script"       // an error about this call: a reply Redis gave it, or one the engine could not read
	ErrKindOther       ErrKind = "other"        // an invalid Op (a bug, or a value the configuration should have refused)
)

// ErrKinds lists every kind, so metrics can start each at zero.
var ErrKinds = []ErrKind{ErrKindTimeout, ErrKindCircuitOpen, ErrKindConnection, ErrKindAuth, ErrKindScript, ErrKindOther}

// replyKinds are the Redis error replies that are not about one call, with
// their kind and whether they mean Redis cannot serve anybody (an outage,
// which the breaker counts). NOPERM is about this limiter's commands or
// keys: it must not open a circuit every limiter on a healthy Redis shares.
var replyKinds = []struct {
	prefix string
	kind   ErrKind
	outage bool
}{
	{"WRONGPASS", ErrKindAuth, true},
	{"NOAUTH", ErrKindAuth, true},
	{"NOPERM", ErrKindAuth, false},
	{"LOADING", ErrKindConnection, true},
	{"BUSY", ErrKindConnection, true},
	{"MASTERDOWN", ErrKindConnection, true},
	{"CLUSTERDOWN", ErrKindConnection, true},
	{"TRYAGAIN", ErrKindConnection, true},
	{"READONLY", ErrKindConnection, true},
	{"OOM", ErrKindConnection, true},
	{"MISCONF", ErrKindConnection, true},
}

// KindOf sorts err.
func KindOf(err error) ErrKind {
	kind, _ := classify(err)
	return kind
}

// IsUnavailable reports whether err says the store cannot serve requests at
// all (an outage), as opposed to an error about one request: a network
// error, a timeout, a full pool, a closed client, a late check, an
// authentication failure, or a reply saying the server is loading, busy,
// read-only, out of memory or without a master. The breaker counts only
// these.
func IsUnavailable(err error) bool {
	_, outage := classify(err)
	return outage
}

func classify(err error) (ErrKind, bool) {
	if err == nil {
		return ErrKindNone, false // before ne, which escapes: no allocation per request
	}
	var ne net.Error
	switch {
	case errors.Is(err, ErrCircuitOpen):
		return ErrKindCircuitOpen, false
	case errors.Is(err, ErrInvalidOp):
		return ErrKindOther, false
	case errors.Is(err, ErrBadReply):
		return ErrKindScript, false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrLate), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &ne) && ne.Timeout():
		return ErrKindTimeout, true
	}
	var re redis.Error
	if !errors.As(err, &re) || errors.Is(err, io.EOF) {
		// Not a reply from Redis: connection-level trouble (dial, TLS,
		// EOF, a closed client, a full pool).
		return ErrKindConnection, true
	}
	msg := re.Error()
	for _, r := range replyKinds {
		if strings.HasPrefix(msg, r.prefix) {
			return r.kind, r.outage
		}
	}
	return ErrKindScript, false
}
