package limiter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestCluster runs the whole conformance table (every algorithm, the
// global ceiling cases among them) against a real 3-master Redis Cluster
// through go-redis's cluster client: every script must be legal on a
// cluster (no CROSSSLOT), and each case's keys, which share the identity's
// hash tag, land on whichever master owns that slot. Then it shows that
// identities spread over all three masters.
func TestCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	store := limiter.NewRedisStore(client)

	t.Run("conformance", func(t *testing.T) {
		if len(conformance) == 0 {
			t.Fatal("empty conformance table")
		}
		for _, cc := range conformance {
			t.Run(cc.name, func(t *testing.T) {
				t.Parallel()
				runCase(t, store, cc)
			})
		}
	})

	t.Run("keys spread over every master", func(t *testing.T) {
		// 60 identities per algorithm, each with a region bucket and a
		// global ceiling (two keys, one slot), under a prefix of their own.
		ctx := context.Background()
		const ids = 60
		var algs []limiter.Algorithm
		for a := limiter.Algorithm(0); ; a++ {
			if _, err := limiter.ParseAlgorithm(a.String()); err != nil {
				break
			}
			algs = append(algs, a)
		}
		if len(algs) == 0 {
			t.Fatal("no algorithm parses")
		}
		for _, alg := range algs {
			kb, err := limiter.NewKeyBuilder("spread:", "cluster", alg)
			if err != nil {
				t.Fatal(err)
			}
			for i := range ids {
				id := "user-" + strconv.Itoa(i)
				req := &limiter.Request{
					Algorithm: alg,
					Window:    time.Minute,
					Now:       t0,
					Bucket:    limiter.Bucket{Key: kb.Bucket(id, true, "eu"), Limit: 5},
					Global:    limiter.Bucket{Key: kb.Global(id), Limit: 7},
				}
				res, err := store.Allow(ctx, req)
				if err != nil {
					t.Fatalf("%s, identity %s: %v", alg, id, err)
				}
				if !res.Allowed || res.Bucket.Count != 1 || res.Global.Count != 1 {
					t.Fatalf("%s, identity %s: first request %+v, want admitted with counts 1/1", alg, id, res)
				}
			}
		}
		// Count this test's keys on each master, and check each identity's
		// two keys sit on one node.
		total := 0
		for _, srv := range cluster.Servers {
			c := srv.Client(t)
			keys, err := c.Keys(ctx, "spread:*").Result()
			if err != nil {
				t.Fatalf("%s KEYS: %v", srv.Addr(), err)
			}
			if len(keys) == 0 {
				t.Errorf("master %s holds none of the %d identities' keys: keys are not spread", srv.Addr(), ids*len(algs))
			}
			t.Logf("master %s: %d keys", srv.Addr(), len(keys))
			total += len(keys)
			onNode := make(map[string]bool, len(keys))
			for _, k := range keys {
				onNode[k] = true
			}
			for _, alg := range algs {
				kb, _ := limiter.NewKeyBuilder("spread:", "cluster", alg)
				for i := range ids {
					id := "user-" + strconv.Itoa(i)
					if onNode[kb.Bucket(id, true, "eu")] != onNode[kb.Global(id)] {
						t.Errorf("%s identity %s: bucket and global ceiling on different nodes", alg, id)
					}
				}
			}
		}
		if want := 2 * ids * len(algs); total < want {
			t.Errorf("%d keys over the masters, want at least %d (a bucket and a ceiling per identity)", total, want)
		}
	})
}
