package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestMultidcExampleRunsAsTwoDatacenters: examples/multidc.Caddyfile runs,
// as its comment says, as two data centres on one host: two Caddy
// processes of this repo's build, each with its own port, admin address,
// data centre name and Redis from the environment, sharing a ledger; the
// limits from the environment too (GLOBAL_LIMIT 6): one key sent to both
// is admitted in each, 6 at most in all, the rest 429; each admin API
// names its data centre.
func TestMultidcExampleRunsAsTwoDatacenters(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	ledger, eu, us := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	ports, err := redistest.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	type node struct{ site, admin string }
	run := func(dc string, store *redistest.Server, site, admin int) node {
		home := t.TempDir()
		cmd := exec.Command(bin, "run", "--config", "examples/multidc.Caddyfile", "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home+"/config", "XDG_DATA_HOME="+home+"/data",
			fmt.Sprintf("PORT=%d", site), fmt.Sprintf("ADMIN=127.0.0.1:%d", admin), "DATACENTER="+dc,
			"REDIS_URL=redis://"+store.Addr(), "LEDGER_URL=redis://"+ledger.Addr(), "GLOBAL_LIMIT=6", "REGION_LIMIT=100")
		var out bytes.Buffer
		var mu sync.Mutex
		cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &out}, lockedWriter{&mu, &out}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				mu.Lock()
				t.Logf("caddy %s:\n%s", dc, out.String())
				mu.Unlock()
			}
		})
		n := node{site: fmt.Sprintf("http://127.0.0.1:%d/", site), admin: fmt.Sprintf("http://127.0.0.1:%d/sliding_ratelimit/", admin)}
		deadline := time.Now().Add(30 * time.Second)
		for {
			// Up: the admin API answers and the site listens (the admin
			// API starts first; a TCP connection, not a request, so that
			// nothing is counted).
			resp, err := http.Get(n.admin)
			if err == nil {
				resp.Body.Close()
				var c net.Conn
				if c, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", site)); err == nil {
					c.Close()
					return n
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("caddy %s not up in 30 s: %v", dc, err)
			}
			time.Sleep(100 * time.Millisecond) // waiting for the process to listen
		}
	}
	nodes := map[string]node{"eu-west": run("eu-west", eu, ports[0], ports[1]), "us-east": run("us-east", us, ports[2], ports[3])}

	admitted, total := map[string]int{}, 0
	for range 10 {
		for _, dc := range []string{"eu-west", "us-east"} {
			req, _ := http.NewRequest(http.MethodGet, nodes[dc].site, nil)
			req.Header.Set("X-API-Key", "k")
			req.Header.Set("X-Region", dc)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				admitted[dc]++
				total++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s: status %d", dc, resp.StatusCode)
			}
		}
	}
	if total > 6 || admitted["eu-west"] == 0 || admitted["us-east"] == 0 {
		t.Errorf("admitted %v: want each data centre to admit, 6 (GLOBAL_LIMIT) at most in all", admitted)
	}
	for dc, n := range nodes {
		resp, err := http.Get(n.admin)
		if err != nil {
			t.Fatal(err)
		}
		var list []limiterInfo
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		global := ""
		for _, w := range firstOf(list).Windows {
			if w.Global {
				b, _ := json.Marshal(w.Limit)
				global = string(b)
			}
		}
		if err != nil || len(list) != 1 || list[0].Datacenter != dc || global != "6" {
			t.Errorf("%s's admin lists %+v (%v): want the limiter api in %s, its global limit 6", dc, list, err, dc)
		}
	}
}

func firstOf(l []limiterInfo) limiterInfo {
	if len(l) == 0 {
		return limiterInfo{}
	}
	return l[0]
}

// lockedWriter is a writer two goroutines (a process's stdout and stderr)
// share.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
