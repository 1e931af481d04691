package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ParseInfo reads the text of INFO [section] ("# Server", "redis_version:7.0.15",
// ...) into a map of field to value. Section headers, comments and blank
// lines are skipped; \r\n and \n line ends are both fine. A value keeps any
// further colons (e.g. "executable:/usr/bin/redis-server").
func ParseInfo(text string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// InfoInt returns the integer field of parsed INFO (e.g. "used_memory").
func InfoInt(info map[string]string, field string) (int64, error) {
	v, ok := info[field]
	if !ok {
		return 0, fmt.Errorf("INFO has no %s", field)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("INFO %s: %w", field, err)
	}
	return n, nil
}

// CommandStat is one command's line of INFO commandstats, e.g.
// "cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0".
// Usec is the time Redis spent executing the command (for EVAL and EVALSHA
// the whole script, including the commands it calls).
type CommandStat struct {
	Calls         int64
	Usec          int64
	UsecPerCall   float64
	RejectedCalls int64
	FailedCalls   int64
}

// Sub returns s - o (the figures of a period between two snapshots), with
// UsecPerCall recomputed for the period.
func (s CommandStat) Sub(o CommandStat) CommandStat {
	d := CommandStat{
		Calls: s.Calls - o.Calls, Usec: s.Usec - o.Usec,
		RejectedCalls: s.RejectedCalls - o.RejectedCalls, FailedCalls: s.FailedCalls - o.FailedCalls,
	}
	if d.Calls > 0 {
		d.UsecPerCall = float64(d.Usec) / float64(d.Calls)
	}
	return d
}

// CommandStats is INFO commandstats by lowercase command name without the
// cmdstat_ prefix ("evalsha", "zadd", "client|setinfo", ...).
type CommandStats map[string]CommandStat

// ParseCommandStats reads the text of INFO commandstats. Lines that are not
// cmdstat_ lines are skipped, as are unknown fields.
func ParseCommandStats(text string) CommandStats {
	out := CommandStats{}
	for k, v := range ParseInfo(text) {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var st CommandStat
		for kv := range strings.SplitSeq(v, ",") {
			f, val, _ := strings.Cut(kv, "=")
			switch f {
			case "calls":
				st.Calls, _ = strconv.ParseInt(val, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(val, 10, 64)
			case "usec_per_call":
				st.UsecPerCall, _ = strconv.ParseFloat(val, 64)
			case "rejected_calls":
				st.RejectedCalls, _ = strconv.ParseInt(val, 10, 64)
			case "failed_calls":
				st.FailedCalls, _ = strconv.ParseInt(val, 10, 64)
			}
		}
		out[strings.ToLower(name)] = st
	}
	return out
}

// ScriptCommands are the commands that run a Lua script or function: one
// call each (a call may carry several checks when the caller batches them).
var ScriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// Sum adds up the named commands (absent ones count 0), with UsecPerCall
// recomputed over the sum.
func (cs CommandStats) Sum(names ...string) CommandStat {
	var t CommandStat
	for _, n := range names {
		s := cs[n]
		t.Calls += s.Calls
		t.Usec += s.Usec
		t.RejectedCalls += s.RejectedCalls
		t.FailedCalls += s.FailedCalls
	}
	if t.Calls > 0 {
		t.UsecPerCall = float64(t.Usec) / float64(t.Calls)
	}
	return t
}

// Scripts is Sum(ScriptCommands...): every EVALSHA, EVAL and FCALL (and
// their _ro forms).
func (cs CommandStats) Scripts() CommandStat { return cs.Sum(ScriptCommands...) }

// CPUStats is INFO cpu: the CPU time the server process used so far
// (getrusage), in user and system mode, and that of its children (forks for
// persistence).
type CPUStats struct {
	Sys, User                 time.Duration
	SysChildren, UserChildren time.Duration
}

// Total is Sys + User (the server's own CPU time, all its threads).
func (c CPUStats) Total() time.Duration { return c.Sys + c.User }

// Sub returns c - o, the CPU time used between two snapshots.
func (c CPUStats) Sub(o CPUStats) CPUStats {
	return CPUStats{
		Sys: c.Sys - o.Sys, User: c.User - o.User,
		SysChildren: c.SysChildren - o.SysChildren, UserChildren: c.UserChildren - o.UserChildren,
	}
}

// ParseCPU reads the text of INFO cpu ("used_cpu_sys:1.234567", ...). It
// fails if used_cpu_sys or used_cpu_user is missing or malformed.
func ParseCPU(text string) (CPUStats, error) {
	info := ParseInfo(text)
	var c CPUStats
	for _, f := range []struct {
		name     string
		dst      *time.Duration
		required bool
	}{
		{"used_cpu_sys", &c.Sys, true},
		{"used_cpu_user", &c.User, true},
		{"used_cpu_sys_children", &c.SysChildren, false},
		{"used_cpu_user_children", &c.UserChildren, false},
	} {
		v, ok := info[f.name]
		if !ok {
			if f.required {
				return c, fmt.Errorf("INFO cpu has no %s", f.name)
			}
			continue
		}
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return c, fmt.Errorf("INFO cpu %s: %w", f.name, err)
		}
		*f.dst = time.Duration(secs * float64(time.Second))
	}
	return c, nil
}

// InfoClient is what the INFO helpers need of a client: *redis.Client,
// *redis.ClusterClient (answers from one node) and the like.
type InfoClient interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Info runs INFO section (all default sections for "") and parses it.
func Info(ctx context.Context, c InfoClient, section string) (map[string]string, error) {
	text, err := infoText(ctx, c, section)
	if err != nil {
		return nil, err
	}
	return ParseInfo(text), nil
}

// ReadCommandStats runs INFO commandstats and parses it.
func ReadCommandStats(ctx context.Context, c InfoClient) (CommandStats, error) {
	text, err := infoText(ctx, c, "commandstats")
	if err != nil {
		return nil, err
	}
	return ParseCommandStats(text), nil
}

// ReadCPU runs INFO cpu and parses it.
func ReadCPU(ctx context.Context, c InfoClient) (CPUStats, error) {
	text, err := infoText(ctx, c, "cpu")
	if err != nil {
		return CPUStats{}, err
	}
	return ParseCPU(text)
}

func infoText(ctx context.Context, c InfoClient, section string) (string, error) {
	var cmd *redis.StringCmd
	if section == "" {
		cmd = c.Info(ctx)
	} else {
		cmd = c.Info(ctx, section)
	}
	text, err := cmd.Result()
	if err != nil {
		if section == "" {
			return "", fmt.Errorf("INFO: %w", err)
		}
		return "", fmt.Errorf("INFO %s: %w", section, err)
	}
	return text, nil
}
