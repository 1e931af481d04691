package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelMaster is the master name StartSentinel's Sentinels monitor.
const SentinelMaster = "mymaster"

const sentinelTimeout = 20 * time.Second // how long StartSentinel waits for the setup to settle

// Sentinel is a Sentinel-managed Redis started for a test: one master, one
// replica of it and one or more Sentinels monitoring it as SentinelMaster
// (down-after-milliseconds 1000, failover-timeout 5000, quorum a majority
// of the Sentinels).
type Sentinel struct {
	Master    *Server
	Replica   *Server
	Sentinels []*Server
}

// Addrs returns the "127.0.0.1:PORT" address of every Sentinel.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// MasterAddr asks the first Sentinel that answers for the current master's
// "host:port" (SENTINEL GET-MASTER-ADDR-BY-NAME). It calls t.Fatalf if
// none answers.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	bin := lookPath(t, "redis-cli")
	var errs []string
	for _, sn := range s.Sentinels {
		out, err := sn.cli(bin, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
		f := strings.Fields(out)
		if err == nil && len(f) == 2 {
			return net.JoinHostPort(f[0], f[1])
		}
		errs = append(errs, fmt.Sprintf("%s: %v %q", sn.Addr(), err, out))
	}
	t.Fatalf("redistest: no Sentinel knows the master: %s", strings.Join(errs, "; "))
	return ""
}

// StartSentinel starts a master, a replica (--replicaof the master) and n
// (1 to 3) Sentinels ("redis-server <conf> --sentinel", the conf written to
// each Sentinel's own temp dir, which Sentinel rewrites), all on 127.0.0.1.
// It waits until the replica is in sync and every Sentinel knows the
// master, the replica and the other Sentinels, so a failover can happen as
// soon as the master goes away. It calls t.Fatalf otherwise.
func StartSentinel(t testing.TB, n int) *Sentinel {
	t.Helper()
	if n < 1 || n > 3 {
		t.Fatalf("redistest: StartSentinel needs 1 to 3 Sentinels, got %d", n)
	}
	cliBin := lookPath(t, "redis-cli")
	// Diskless sync without delay: the replica is in sync at once.
	repl := []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
	s := &Sentinel{Master: Start(t, repl...)}
	s.Replica = Start(t, append(repl, "--replicaof", "127.0.0.1", strconv.Itoa(s.Master.Port))...)

	deadline := time.Now().Add(sentinelTimeout)
	waitFor := func(srv *Server, what string, args []string, ok func(string) bool) {
		t.Helper()
		for {
			out, err := srv.cli(cliBin, args...)
			if err == nil && ok(out) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: sentinel setup: %s not reached after %v: %s %s (err %v):\n%s\n%s",
					what, sentinelTimeout, srv.Addr(), strings.Join(args, " "), err, out, srv.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(s.Replica, "replica in sync", []string{"INFO", "replication"}, func(out string) bool {
		return strings.Contains(out, "master_link_status:up")
	})

	quorum := n/2 + 1
	for range n {
		sn := startTB(t, LaunchOptions{ArgsFor: func(port int, dir string) ([]string, error) {
			conf := filepath.Join(dir, "sentinel.conf")
			body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
				"sentinel monitor %s 127.0.0.1 %d %d\n"+
				"sentinel down-after-milliseconds %s 1000\n"+
				"sentinel failover-timeout %s 5000\n",
				port, dir, SentinelMaster, s.Master.Port, quorum, SentinelMaster, SentinelMaster)
			if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
				return nil, err
			}
			return []string{conf, "--sentinel"}, nil
		}})
		s.Sentinels = append(s.Sentinels, sn)
	}
	for _, sn := range s.Sentinels {
		waitFor(sn, "Sentinel knows master, replica and the other Sentinels", []string{"SENTINEL", "MASTER", SentinelMaster}, func(out string) bool {
			f := fieldsOf(out)
			return f["flags"] == "master" && f["num-slaves"] == "1" && f["num-other-sentinels"] == strconv.Itoa(n-1)
		})
		waitFor(sn, "Sentinel sees the replica up", []string{"SENTINEL", "REPLICAS", SentinelMaster}, func(out string) bool {
			f := fieldsOf(out)
			return f["port"] == strconv.Itoa(s.Replica.Port) && f["flags"] == "slave" && f["master-link-status"] == "ok"
		})
	}
	return s
}

// fieldsOf reads redis-cli's rendering of a flat name/value reply (one
// element per line) into a map.
func fieldsOf(out string) map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	m := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		m[strings.TrimSpace(lines[i])] = strings.TrimSpace(lines[i+1])
	}
	return m
}
