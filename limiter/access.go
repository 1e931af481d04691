package limiter

import (
	"context"
	"errors"
	"regexp"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// scriptCallRE matches the command of a redis.call("NAME", ...) in a
// script, and of call("NAME", ...) (scripts keep redis.call in a local).
var scriptCallRE = regexp.MustCompile(`\bp?call\(\s*["']([A-Za-z]+)["']`)

// storeCommands are the commands the store's scripts call (every script
// but ledger.lua); ledgerCommands those ledger.lua calls. Read from the
// scripts themselves, so a command a script starts calling is checked too.
var storeCommands, ledgerCommands = scriptCommands()

func scriptCommands() (store, ledger []string) {
	seen := map[string]map[string]bool{"store": {}, "ledger": {}}
	for name, src := range lua.Files {
		side := "store"
		if name == "ledger.lua" {
			side = "ledger"
		}
		for _, m := range scriptCallRE.FindAllStringSubmatch(src, -1) {
			seen[side][strings.ToLower(m[1])] = true
		}
	}
	list := func(m map[string]bool) []string {
		out := make([]string, 0, len(m))
		for c := range m {
			out = append(out, c)
		}
		sort.Strings(out)
		return out
	}
	return list(seen["store"]), list(seen["ledger"])
}

// accessScript asks Redis whether the caller's ACL user may call a
// script (ARGV[1]: "store", by FCALL or EVALSHA; "ledger", by EVALSHA) and
// run each command of ARGV[2..] on KEYS[1] (redis.acl_check_cmd, Redis 7
// and later), and returns what it may not. It writes nothing. Before
// Redis 7 it cannot tell and returns the marker "?". (Every question
// carries well-formed arguments: Redis 7.0 crashes on an FCALL or EVALSHA
// asked about without its numkeys.) The EVAL itself names KEYS[1], so a
// key outside the user's pattern is refused by Redis first (NOPERM).
var accessScript = redis.NewScript(`
if not redis.acl_check_cmd then return {"?"} end
local key = KEYS[1]
local function may(...)
  local ok, yes = pcall(redis.acl_check_cmd, ...)
  return ok and yes
end
local out = {}
local sha = string.rep("0", 40)
if ARGV[1] == "store" and not (may("fcall", "decide", "1", key) or may("evalsha", sha, "1", key)) then
  out[#out + 1] = "fcall or evalsha"
elseif ARGV[1] == "ledger" and not may("evalsha", sha, "1", key) then
  out[#out + 1] = "evalsha"
end
for i = 2, #ARGV do
  if not may(ARGV[i], key) then out[#out + 1] = ARGV[i] end
end
return out
`)

// AccessError is a Redis user's missing permission to run what the
// scripts call (see CheckAccess).
type AccessError struct {
	Key    string   // the key asked about
	Denied []string // the commands the user may not run on Key
}

func (e *AccessError) Error() string {
	return "the ACL user may not run " + strings.Join(e.Denied, ", ") + " on '" + e.Key +
		"', which the scripts call (redis.acl_check_cmd)"
}

// CheckAccess asks Redis whether the client's user may call the store's
// scripts (ledger: the ledger's) and run, on key (a key of the namespace
// the limiter writes), every command they call. It returns an *AccessError
// naming what the user may not do, Redis's error when it refuses the
// question (see IsRefusal), and nil when the user may do it all or Redis
// cannot tell: before Redis 7, or, unless evalNeeded, for a user who may
// not run EVAL (a store that calls FCALL needs no EVAL). It is not fooled
// by a script Redis does not hold yet (EVALSHA answering NOSCRIPT to a
// user who may call it): the question is one EVAL of its own text, and
// redis.acl_check_cmd checks the commands the scripts call, on the key,
// not only the call of the script. It writes nothing.
func CheckAccess(ctx context.Context, c redis.Scripter, key string, ledger, evalNeeded bool) error {
	cmds, side := storeCommands, "store"
	if ledger {
		cmds, side = ledgerCommands, "ledger"
	}
	args := make([]any, 0, 1+len(cmds))
	args = append(args, side)
	for _, c := range cmds {
		args = append(args, c)
	}
	out, err := accessScript.Eval(ctx, c, []string{key}, args...).StringSlice()
	switch {
	case err != nil && !evalNeeded && redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(err.Error(), "'eval'"):
		return nil
	case err != nil:
		return err
	case len(out) == 1 && out[0] == "?":
		return nil
	case len(out) > 0:
		return &AccessError{Key: key, Denied: out}
	}
	return nil
}

// IsRefusal reports whether err is Redis refusing the client for what its
// configuration says (a wrong password, a user without the permission),
// not an outage: WRONGPASS, NOAUTH, NOPERM (ErrKindAuth), or an
// *AccessError.
func IsRefusal(err error) bool {
	var ae *AccessError
	if errors.As(err, &ae) {
		return true
	}
	return KindOf(err) == ErrKindAuth
}
