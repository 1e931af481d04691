package redistest

import (
	"context"
	"testing"
	"time"
)

// Samples of redis-server 7.0.15's INFO output, \r\n line ends as on the wire.
const (
	infoCommandstats = "# Commandstats\r\n" +
		"cmdstat_zadd:calls=1,usec=16,usec_per_call=16.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=1,usec=35,usec_per_call=35.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_script|load:calls=2,usec=20,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=1,failed_calls=2\r\n"
	infoCPU = "# CPU\r\n" +
		"used_cpu_sys:0.009256\r\n" +
		"used_cpu_user:1.500000\r\n" +
		"used_cpu_sys_children:0.000000\r\n" +
		"used_cpu_user_children:0.000000\r\n" +
		"used_cpu_sys_main_thread:0.009158\r\n" +
		"used_cpu_user_main_thread:0.000000\r\n"
	infoServer = "# Server\r\n" +
		"redis_version:7.0.15\r\n" +
		"redis_mode:standalone\r\n" +
		"os:Linux 6.18.44-fc-v657 x86_64\r\n" +
		"executable:/usr/bin/redis-server\r\n" +
		"\r\n# Memory\r\nused_memory:1047128\r\nused_memory_human:1022.59K\r\n"
)

func TestParseInfo(t *testing.T) {
	m := ParseInfo(infoServer)
	for k, want := range map[string]string{
		"redis_version": "7.0.15", "os": "Linux 6.18.44-fc-v657 x86_64",
		"executable": "/usr/bin/redis-server", "used_memory_human": "1022.59K",
	} {
		if m[k] != want {
			t.Errorf("%s = %q, want %q", k, m[k], want)
		}
	}
	if len(m) != 6 {
		t.Errorf("got %d fields, want 6 (no section headers): %v", len(m), m)
	}
	if n, err := InfoInt(m, "used_memory"); err != nil || n != 1047128 {
		t.Errorf("InfoInt(used_memory) = %d, %v", n, err)
	}
	if _, err := InfoInt(m, "nope"); err == nil {
		t.Error("InfoInt of a missing field: want an error")
	}
	if _, err := InfoInt(m, "used_memory_human"); err == nil {
		t.Error("InfoInt of a non-integer: want an error")
	}
}

func TestParseCommandStats(t *testing.T) {
	cs := ParseCommandStats(infoCommandstats)
	if got := cs["evalsha"]; got != (CommandStat{Calls: 100, Usec: 900, UsecPerCall: 9, RejectedCalls: 1, FailedCalls: 2}) {
		t.Errorf("evalsha = %+v", got)
	}
	if got := cs["script|load"]; got.Calls != 2 || got.Usec != 20 {
		t.Errorf("script|load = %+v", got)
	}
	if len(cs) != 4 {
		t.Errorf("got %d commands, want 4: %v", len(cs), cs)
	}
	sc := cs.Scripts()
	if sc.Calls != 101 || sc.Usec != 935 || sc.UsecPerCall != 935.0/101 {
		t.Errorf("Scripts() = %+v, want 101 calls, 935 usec", sc)
	}
	if got := cs.Sum("nope"); got != (CommandStat{}) {
		t.Errorf("Sum of an absent command = %+v", got)
	}
	later := ParseCommandStats("cmdstat_evalsha:calls=150,usec=1400,usec_per_call=9.33,rejected_calls=1,failed_calls=2\r\n")
	d := later["evalsha"].Sub(cs["evalsha"])
	if d.Calls != 50 || d.Usec != 500 || d.UsecPerCall != 10 {
		t.Errorf("Sub = %+v, want 50 calls, 500 usec, 10 per call", d)
	}
}

func TestParseCPU(t *testing.T) {
	c, err := ParseCPU(infoCPU)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sys != 9256*time.Microsecond || c.User != 1500*time.Millisecond || c.Total() != 1509256*time.Microsecond {
		t.Errorf("ParseCPU = %+v", c)
	}
	later, _ := ParseCPU("used_cpu_sys:0.019256\r\nused_cpu_user:1.600000\r\n")
	if d := later.Sub(c); d.Total() != 110*time.Millisecond {
		t.Errorf("Sub = %+v, want 110ms in all", d)
	}
	if _, err := ParseCPU("# CPU\r\nused_cpu_sys:0.1\r\n"); err == nil {
		t.Error("no used_cpu_user: want an error")
	}
	if _, err := ParseCPU("used_cpu_sys:x\r\nused_cpu_user:0\r\n"); err == nil {
		t.Error("malformed used_cpu_sys: want an error")
	}
}

// TestInfoLive reads the helpers' figures from a real server: scripts run
// show up in the command stats, and CPU time only grows.
func TestInfoLive(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	cs0, err := ReadCommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	cpu0, err := ReadCPU(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	for range 200 {
		pipe.Eval(ctx, "return 1", nil)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	cs1, _ := ReadCommandStats(ctx, c)
	cpu1, _ := ReadCPU(ctx, c)
	if d := cs1.Scripts().Sub(cs0.Scripts()); d.Calls != 200 || d.Usec <= 0 {
		t.Errorf("script calls delta %+v, want 200 calls", d)
	}
	if d := cpu1.Sub(cpu0); d.Total() < 0 {
		t.Errorf("CPU went back: %+v", d)
	}
	info, err := Info(ctx, c, "server")
	if err != nil || info["redis_version"] == "" || info["tcp_port"] != itoa(s.Port) {
		t.Errorf("INFO server: %v, %v", info, err)
	}
}
