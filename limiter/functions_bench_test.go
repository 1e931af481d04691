package limiter_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// BenchmarkRedisCPUPerCheck: what Redis spends per sliding_log check by
// FCALL of the library and by EVALSHA, each path on its own redis-server,
// each iteration sending the same checks to both in turn, so that both
// figures come from the same moments of a noisy machine. Two figures per
// path: cpu-µs, the server's CPU time (INFO cpu, user + sys: the script and
// the socket I/O, not counting time the server waited for a CPU), and
// usec, INFO commandstats' time in the call (wall time, so it grows when
// the machine is busy). 10,000 keys, limit 10,000 a minute: every check is
// admitted. "one": one check per call; "batch16": 16 concurrent checks
// through a batching store (two pipelines), a few checks per call. An
// iteration is a round of 400 checks on each path.
func BenchmarkRedisCPUPerCheck(b *testing.B) {
	for _, conc := range []int{1, 16} {
		name := "one"
		var opts []limiter.RedisOption
		if conc > 1 {
			name, opts = "batch"+strconv.Itoa(conc), []limiter.RedisOption{limiter.WithBatching(2, 64)}
		}
		b.Run(name, func(b *testing.B) {
			type path struct {
				name  string
				srv   *redistest.Server
				store *limiter.RedisStore
				info  *redis.Client
				cpu   time.Duration
				usec  int64
			}
			paths := []*path{{name: "fcall"}, {name: "evalsha"}}
			for i, p := range paths {
				p.srv = redistest.Start(b)
				o := opts
				if i == 1 {
					o = append(o, limiter.WithScripts(limiter.ScriptsEval))
				}
				p.store = limiter.NewRedisStore(p.srv.Client(b), o...)
				p.info = p.srv.Client(b)
				defer p.store.Close()
			}
			ctx := context.Background()
			// run sends round checks, conc at a time, to p, and adds what
			// Redis spent on them.
			const round = 400
			run := func(p *path, first int) {
				cpu0, _ := redistest.ReadCPU(ctx, p.info)
				cs0 := p.srv.CommandStats(b).Scripts()
				for i := 0; i < round; i += conc {
					var wg sync.WaitGroup
					for j := range conc {
						wg.Go(func() {
							o := pathOp("bench:{"+strconv.Itoa((first+i+j)%10000)+"}", false)
							o.Parts[0].Windows[0].Limit = 10000
							if _, err := p.store.Do(ctx, o); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				cpu1, _ := redistest.ReadCPU(ctx, p.info)
				p.cpu += cpu1.Sub(cpu0).Total()
				p.usec += p.srv.CommandStats(b).Scripts().Sub(cs0).Usec
			}
			for _, p := range paths {
				run(p, 0) // loads the library or the script
				p.cpu, p.usec = 0, 0
			}
			n := 0
			for b.Loop() {
				for _, p := range paths {
					run(p, n*round)
				}
				n++
			}
			checks := float64(n * round)
			for _, p := range paths {
				b.ReportMetric(float64(p.cpu.Microseconds())/checks, p.name+"-cpu-µs/check")
				b.ReportMetric(float64(p.usec)/checks, p.name+"-usec/check")
			}
		})
	}
}
