package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// runResult is one measured run of one service.
type runResult struct {
	Checks, Over, Errors uint64
	Elapsed              time.Duration
	P50, P99             time.Duration
	ServiceCPU, RedisCPU time.Duration // used during the run
	LastErr              string
}

func (r runResult) perSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Checks) / r.Elapsed.Seconds()
}

// cpuPerCheck is d per check answered.
func (r runResult) cpuPerCheck(d time.Duration) time.Duration {
	if r.Checks == 0 {
		return 0
	}
	return d / time.Duration(r.Checks)
}

// client is one setting's connections to one service.
type client struct {
	conns []*grpc.ClientConn
	rls   []pb.RateLimitServiceClient
}

func dial(addr string, n int) (*client, error) {
	c := &client{}
	for range n {
		// One ClientConn is one HTTP/2 connection: n of them are n
		// connections, as n Envoy workers would have.
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, err
		}
		conn.Connect()
		c.conns = append(c.conns, conn)
		c.rls = append(c.rls, pb.NewRateLimitServiceClient(conn))
	}
	return c, nil
}

func (c *client) close() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// drive runs inFlight checks at a time (closed loop: each goroutine sends
// its next check when the last is answered) for d, each of a key drawn
// from keys, and measures them.
func drive(ctx context.Context, c *client, s *service, inFlight, keys int, d time.Duration) runResult {
	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		mu        sync.Mutex
		lat       []time.Duration
		res       runResult
		lastErr   atomic.Value
		checks    atomic.Uint64
		over      atomic.Uint64
		errs      atomic.Uint64
		seedStart = rand.Uint64()
	)
	start := time.Now()
	for g := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seedStart, uint64(g)))
			rl := c.rls[g%len(c.rls)]
			own := make([]time.Duration, 0, 4096)
			for !stop.Load() && ctx.Err() == nil {
				req := request(s.Domain, randKey(r, keys), 1)
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				t := time.Now()
				resp, err := rl.ShouldRateLimit(cctx, req)
				el := time.Since(t)
				cancel()
				if err != nil {
					errs.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				checks.Add(1)
				if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
					over.Add(1)
				}
				own = append(own, el)
			}
			mu.Lock()
			lat = append(lat, own...)
			mu.Unlock()
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Checks, res.Over, res.Errors = checks.Load(), over.Load(), errs.Load()
	if v, ok := lastErr.Load().(string); ok {
		res.LastErr = v
	}
	slices.Sort(lat)
	res.P50, res.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return res
}

// quantile of sorted durations (nearest rank); 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// measure is one measured run of s, with the service's and Redis's CPU
// time read around it.
func measure(ctx context.Context, c *client, s *service, st setting, keys int, d time.Duration, rc *redis.Client) (runResult, error) {
	// Let the last run's work end and its garbage go, so it does not tax
	// this one.
	runtime.GC()
	time.Sleep(200 * time.Millisecond)
	sb, err1 := procs.CPU(s.proc.Pid())
	rb, err2 := redistest.ReadCPU(ctx, rc)
	r := drive(ctx, c, s, st.InFlight, keys, d)
	sa, err3 := procs.CPU(s.proc.Pid())
	ra, err4 := redistest.ReadCPU(ctx, rc)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if s.proc.Exited() {
		return r, fmt.Errorf("%s exited during its run:\n%s", s.Name, s.proc.LogTail(20))
	}
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return r, err
		}
	}
	r.ServiceCPU, r.RedisCPU = sa-sb, ra.Sub(rb).Total()
	if r.Checks == 0 {
		return r, fmt.Errorf("%s answered no check in %v (%d errors, last: %s)", s.Name, d, r.Errors, r.LastErr)
	}
	return r, nil
}

// runSetting warms every service up at st, then runs rounds of pairs:
// each pair one run of ours and one of envoyproxy/ratelimit's, back to
// back, ours first in one round and second in the next (and the pairs of a
// round alternating too), so a pair's two runs see the same machine and no
// service is always first.
func runSetting(ctx context.Context, o options, svcs []*service, st setting, rc *redis.Client) (*settingResult, error) {
	logf("=== %s", st)
	clients := make([]*client, len(svcs))
	for i, s := range svcs {
		c, err := dial(s.Addr, st.Conns)
		if err != nil {
			return nil, err
		}
		defer c.close()
		clients[i] = c
		if o.warmup > 0 {
			drive(ctx, c, s, st.InFlight, o.keys, o.warmup)
		}
	}
	sr := &settingResult{Setting: st, Pairs: pairsOf(svcs)}
	for round := range o.rounds {
		rr := make([]pairRun, len(sr.Pairs))
		line := fmt.Sprintf("[%s] round %d/%d:", st, round+1, o.rounds)
		for k, pr := range sr.Pairs {
			first, second := pr.A, pr.B
			dst := [2]*runResult{&rr[k].A, &rr[k].B}
			if (round+k)%2 == 1 {
				first, second = second, first
				dst[0], dst[1] = dst[1], dst[0]
			}
			for n, i := range []int{first, second} {
				r, err := measure(ctx, clients[i], svcs[i], st, o.keys, o.run, rc)
				if err != nil {
					return nil, err
				}
				*dst[n] = r
				if r.Errors > 0 {
					logf("[%s] %s: %d errors (last: %s)", st, svcs[i].Name, r.Errors, r.LastErr)
				}
			}
			line += fmt.Sprintf("  %s/%s %.0f/%.0f", svcs[pr.A].Name, svcs[pr.B].Name, rr[k].A.perSec(), rr[k].B.perSec())
		}
		logf("%s", line)
		sr.Rounds = append(sr.Rounds, rr)
	}
	return sr, nil
}

// pairsOf pairs each of ours with each envoyproxy/ratelimit; with none of
// the latter, ours with each other.
func pairsOf(svcs []*service) []pairSpec {
	var out []pairSpec
	for i, a := range svcs {
		for j, b := range svcs {
			if !a.Envoy && b.Envoy {
				out = append(out, pairSpec{i, j})
			}
		}
	}
	if len(out) == 0 {
		for i := range svcs {
			for j := i + 1; j < len(svcs); j++ {
				out = append(out, pairSpec{i, j})
			}
		}
	}
	if len(out) == 0 && len(svcs) == 1 {
		out = append(out, pairSpec{0, 0})
	}
	return out
}
