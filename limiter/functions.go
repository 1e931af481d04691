package limiter

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// Scripts says how a RedisStore calls decide.lua.
type Scripts int

const (
	// ScriptsAuto calls the function library where Redis has functions
	// (Redis 7 and later, Valkey), and EVALSHA elsewhere. The default.
	ScriptsAuto Scripts = iota
	// ScriptsEval always calls EVALSHA (EVAL on NOSCRIPT) of the scripts
	// that define what they run on each call (lua.DecideFast, lua.DecideLog,
	// lua.Decide), as on Redis 7 for an ACL user without FUNCTION. (Redis 5
	// and 6 are called by lua.DecideCached under ScriptsAuto.)
	ScriptsEval
)

// WithScripts sets how the store calls its script (ScriptsAuto unless
// set).
func WithScripts(m Scripts) RedisOption {
	return func(s *RedisStore) {
		if m == ScriptsEval {
			s.scripts.path.Store(int32(pathEval))
		}
	}
}

// callPath is how a store calls decide.lua: not known yet (before its first
// call), FCALL of the library, EVALSHA of the scripts that define all they
// run on each call, or EVALSHA of lua.DecideCached (Redis 5 and 6: the body
// built once per Lua state).
type callPath int32

const (
	pathUnknown callPath = iota
	pathFunctions
	pathEval
	pathCached
)

// The first two arguments of a script call, boxed once: every call passes
// them.
var (
	evalshaArg any = "evalsha"
	shaArg     any = script.Hash()
	shaLogArg  any = logScript.Hash()
	evalArg    any = "eval"
	cachedArg  any = redis.NewScript(lua.DecideCached).Hash()
	srcCached  any = lua.DecideCached
	srcArg     any = lua.Decide
	srcLogArg  any = lua.DecideLog
	fcallArg   any = "fcall"
	fcallROArg any = "fcall_ro"
	decideArg  any = lua.DecideFunction
	peekArg    any = lua.PeekFunction
)

// fastSHA and fastSrc are the digests and sources of lua.DecideFast's
// scripts, by kind.
var fastSHA, fastSrc = func() (sha, src [KindShare + 1]any) {
	for k, s := range lua.DecideFast {
		sha[k], src[k] = redis.NewScript(s).Hash(), s
	}
	return sha, src
}()

// scripts is what a store knows of its Redis's way of running the script:
// the call path, learnt at the first call (INFO server: functions from
// Redis 7 on, Valkey included; before 7, EVALSHA of lua.DecideCached), and
// how many times it loaded the library. On FCALL, a "function not found" (a
// Redis restarted empty, FLUSHALL, FUNCTION FLUSH) loads the library and
// sends the call again, as NOSCRIPT sends EVAL; an FCALL or FUNCTION LOAD
// that Redis does not know (an older server) turns the store to EVALSHA of
// lua.DecideCached for good; one that the ACL user may not run, or that a
// Redis whose INFO says 7 or later does not know (a proxy in front of it, a
// renamed command), to the other scripts (Redis 7's _G is read-only).
type scripts struct {
	path  atomic.Int32  // a callPath
	seven atomic.Bool   // INFO said Redis 7 or later (an unknown FCALL is then a proxy's)
	loads atomic.Uint64 // libraries loaded so far
	turn  chan struct{} // held by the one call that detects or loads
}

// head is the command and the script or function a call of checks starts
// with (ro: every check only peeks; log: every check is one lua.DecideLog
// decides; fast: every check is one lua.DecideFast's script of that kind
// takes, or 0), and the number of loads it was sent after.
func (s *RedisStore) head(ctx context.Context, ro, log bool, fast Kind) (cmd, name any, loads uint64) {
	loads = s.scripts.loads.Load()
	path := callPath(s.scripts.path.Load())
	if path == pathUnknown {
		path = s.detect(ctx)
	}
	switch {
	case path == pathCached:
		return evalshaArg, cachedArg, loads
	case path != pathFunctions && fast != 0 && fastSHA[fast] != nil:
		return evalshaArg, fastSHA[fast], loads
	case path != pathFunctions && log:
		return evalshaArg, shaLogArg, loads
	case path != pathFunctions:
		return evalshaArg, shaArg, loads
	case ro:
		return fcallROArg, peekArg, loads
	default:
		return fcallArg, decideArg, loads
	}
}

// detect learns the store's call path from INFO server: functions when
// Redis is 7 or later, or when it refuses INFO (an ACL user without it: the
// first FCALL tells); lua.DecideCached when it is 1 to 6 (Redis 5 and 6,
// whose scripts may keep a global); the other scripts when INFO names no
// version. When Redis cannot be asked (unreachable), this call
// goes by EVALSHA and the next one asks again. Calls made while another
// asks do not wait for it: they go by EVALSHA.
func (s *RedisStore) detect(ctx context.Context) callPath {
	select {
	case s.scripts.turn <- struct{}{}:
		defer func() { <-s.scripts.turn }()
	default:
		return pathEval
	}
	if p := callPath(s.scripts.path.Load()); p != pathUnknown {
		return p // learnt while this call waited
	}
	cmd := redis.NewStringCmd(ctx, "info", "server")
	_ = s.client.Process(ctx, cmd)
	path := pathEval
	var rerr redis.Error
	switch err := cmd.Err(); {
	case err == nil:
		switch m := redisMajor(cmd.Val()); {
		case m >= 7:
			path = pathFunctions
			s.scripts.seven.Store(true)
		case m > 0:
			path = pathCached
		}
	case errors.As(err, &rerr) && !IsUnavailable(err):
		path = pathFunctions
	default:
		return pathEval
	}
	s.scripts.path.Store(int32(path))
	return path
}

// redisMajor is the major version in the text of INFO server (0 if none).
func redisMajor(info string) int {
	_, v, ok := strings.Cut(info, "redis_version:")
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, ".")
	n, _ := strconv.Atoi(v)
	return n
}

// retry readies args, a script call that failed with err, to be sent again
// and reports whether to send it: with the library loaded after "function
// not found", by EVALSHA when Redis cannot run functions, by EVAL after
// NOSCRIPT. loads is the number of loads the call was sent after. When the
// load fails, its error is the call's (a READONLY replica, Redis gone).
func (s *RedisStore) retry(ctx context.Context, err error, args []any, loads uint64) (bool, error) {
	if err == nil {
		return false, nil
	}
	switch args[0] {
	case fcallArg, fcallROArg:
		if isFunctionNotFound(err) {
			if err = s.loadLibrary(ctx, loads); err == nil {
				return true, nil
			}
		}
		if noFunctions(err) {
			// (The full script: the call's checks may be of any kind.) A
			// Redis that does not know FCALL is older than 7: its scripts
			// may keep the body built (lua.DecideCached). Where INFO said 7
			// or later, what does not know it is a proxy (or a renamed
			// command) in front of a Redis whose _G is read-only, where
			// lua.DecideCached would build the body on every call.
			path, sha := pathEval, shaArg
			if unknownCommand(err) && !s.scripts.seven.Load() {
				path, sha = pathCached, cachedArg
			}
			s.scripts.path.Store(int32(path))
			args[0], args[1] = evalshaArg, sha
			return true, nil
		}
	case evalshaArg:
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			src := srcArg
			switch args[1] {
			case shaLogArg:
				src = srcLogArg
			case cachedArg:
				src = srcCached
			}
			for k, sha := range fastSHA {
				if sha != nil && args[1] == sha {
					src = fastSrc[k]
				}
			}
			args[0], args[1] = evalArg, src
			return true, nil
		}
	}
	return false, err
}

// loadLibrary loads the function library (on every master of a cluster),
// unless another call loaded it since this one was sent (after loads
// loads). A library of the same name already there is this one.
func (s *RedisStore) loadLibrary(ctx context.Context, loads uint64) error {
	select {
	case s.scripts.turn <- struct{}{}:
		defer func() { <-s.scripts.turn }()
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.scripts.loads.Load() != loads {
		return nil
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return functionLoad(ctx, c) })
	} else {
		err = functionLoad(ctx, s.client)
	}
	if err == nil {
		s.scripts.loads.Add(1)
	}
	return err
}

// functionLoad sends FUNCTION LOAD of the library to c.
func functionLoad(ctx context.Context, c interface {
	Process(context.Context, redis.Cmder) error
}) error {
	cmd := redis.NewStringCmd(ctx, "function", "load", lua.LibraryCode)
	_ = c.Process(ctx, cmd)
	err := cmd.Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// isFunctionNotFound reports whether err is Redis's answer to an FCALL of
// a function it does not hold.
func isFunctionNotFound(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(err.Error(), "Function not found")
}

// noFunctions reports whether err says Redis will not run functions for
// this client: it does not know the command (Redis 5 or 6, a proxy), or the
// ACL user may not run it (a NOPERM about a key is not about the command).
func noFunctions(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := err.Error()
	return unknownCommand(err) || strings.Contains(msg, "unknown subcommand") ||
		(strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "command"))
}

// unknownCommand reports whether err is a Redis's answer to a command it
// does not know (FCALL, on Redis 5 or 6).
func unknownCommand(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(err.Error(), "unknown command")
}

// call sends one script call, args, and reads its reply, sending it again
// as retry says, at most twice (after a load; or by EVALSHA, then by EVAL).
func (s *RedisStore) call(ctx context.Context, args []any, loads uint64) (any, error) {
	for tries := 0; ; tries++ {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = s.client.Process(ctx, cmd)
		out, err := cmd.Result()
		again := false
		if tries < 2 {
			again, err = s.retry(ctx, err, args, loads)
		}
		if !again {
			return out, err
		}
	}
}
