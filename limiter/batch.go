package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// errBatcherClosed answers calls queued when the store closes.
var errBatcherClosed = errors.New("redis store closed")

// batcher sends the checks of concurrent requests to Redis together: the
// checks of one hash slot (all of them, off a cluster) go in one call of
// decide.lua, which decides them in order, each atomic over its own keys,
// each with its own reply; the calls of one batch go in one pipeline. One
// write and one read per batch instead of per request, and one script call
// per slot instead of per request. A call waits at most for the batch in
// flight on its worker, and never past its own deadline.
type batcher struct {
	store   *RedisStore
	queue   chan *batchOp
	max     int
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// batchOp is one check waiting for its batch.
type batchOp struct {
	ctx  context.Context
	c    check
	slot int
	raw  any
	err  error
	done chan struct{}
}

var opPool = sync.Pool{New: func() any { return &batchOp{done: make(chan struct{}, 1)} }}

func newBatcher(s *RedisStore, workers, maxBatch int) *batcher {
	b := &batcher{
		store: s,
		queue: make(chan *batchOp, 4*maxBatch*workers),
		max:   maxBatch,
		stop:  make(chan struct{}),
	}
	b.stopped.Add(workers)
	for i := 0; i < workers; i++ {
		go b.work()
	}
	return b
}

// close stops the workers; calls still queued fail.
func (b *batcher) close() {
	b.once.Do(func() {
		close(b.stop)
		b.stopped.Wait()
		for {
			select {
			case op := <-b.queue:
				op.err = errBatcherClosed
				op.done <- struct{}{}
			default:
				return
			}
		}
	})
}

// do runs one check through a batch and returns its raw reply.
func (b *batcher) do(ctx context.Context, c check) (any, error) {
	op := opPool.Get().(*batchOp)
	op.ctx, op.c, op.raw, op.err, op.slot = ctx, c, nil, nil, 0
	if b.store.cluster {
		op.slot = Slot(c.keys[0])
	}
	select {
	case b.queue <- op:
	case <-ctx.Done():
		opPool.Put(op)
		return nil, ctx.Err()
	case <-b.stop:
		opPool.Put(op)
		return nil, errBatcherClosed
	}
	select {
	case <-op.done:
		raw, err := op.raw, op.err
		op.ctx, op.c, op.raw = nil, check{}, nil
		opPool.Put(op)
		return raw, err
	case <-ctx.Done():
		// The worker still owns op and will answer into its buffered
		// channel; op is not reused, the garbage collector takes it.
		return nil, ctx.Err()
	}
}

func (b *batcher) work() {
	defer b.stopped.Done()
	batch := make([]*batchOp, 0, b.max)
	for {
		batch = batch[:0]
		select {
		case op := <-b.queue:
			batch = append(batch, op)
		case <-b.stop:
			return
		}
	fill:
		for len(batch) < b.max {
			select {
			case op := <-b.queue:
				batch = append(batch, op)
			default:
				break fill
			}
		}
		b.run(batch)
	}
}

// group is the checks of one slot: one script call.
type group struct {
	ops  []*batchOp
	keys []string
	args []any
	cmd  *redis.Cmd
}

// run sends one batch: a script call per slot, all in one pipeline,
// retrying NOSCRIPT answers with EVAL (which loads the script for the next
// batches).
func (b *batcher) run(batch []*batchOp) {
	live := batch[:0:0]
	var deadline time.Time
	unbounded := false
	for _, op := range batch {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			op.done <- struct{}{}
			continue
		}
		// The batch runs until the latest deadline of its checks, and
		// without one when a check has none: a check is never cut short
		// by a neighbour's deadline (its own caller stops waiting at its
		// own; see do).
		if d, ok := op.ctx.Deadline(); !ok {
			unbounded = true
		} else if d.After(deadline) {
			deadline = d
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	groups := groupBySlot(live)
	ctx := context.Background()
	if !unbounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	errs := b.exec(ctx, groups, false)
	var retry []*group
	for i, g := range groups {
		if errs[i] != nil && redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
			retry = append(retry, g)
		}
	}
	if len(retry) > 0 {
		again := b.exec(ctx, retry, true)
		k := 0
		for i, g := range groups {
			if k < len(retry) && retry[k] == g {
				errs[i] = again[k]
				k++
			}
		}
	}
	for i, g := range groups {
		var replies []any
		err := errs[i]
		if err == nil {
			var out any
			out, err = g.cmd.Result()
			if l, ok := out.([]any); ok && len(l) == len(g.ops) {
				replies = l
			} else if err == nil {
				err = fmt.Errorf("%w: %d replies for %d checks", ErrBadReply, len(l), len(g.ops))
			}
		}
		for j, op := range g.ops {
			if err != nil {
				op.err = err
			} else {
				op.raw = replies[j]
			}
			op.done <- struct{}{}
		}
	}
}

// groupBySlot puts the checks of each slot in one group, in arrival order.
func groupBySlot(ops []*batchOp) []*group {
	var groups []*group
	for _, op := range ops {
		var g *group
		for _, x := range groups {
			if x.ops[0].slot == op.slot {
				g = x
				break
			}
		}
		if g == nil {
			g = &group{args: []any{0}}
			groups = append(groups, g)
		}
		g.ops = append(g.ops, op)
		g.keys = append(g.keys, op.c.keys...)
		g.args = append(g.args, op.c.args...)
	}
	for _, g := range groups {
		g.args[0] = len(g.ops)
	}
	return groups
}

// exec sends one script call per group as one pipeline. A call's error is
// its own, or, when the pipeline failed before the call got an answer (a
// dial or AUTH error), the pipeline's.
func (b *batcher) exec(ctx context.Context, groups []*group, eval bool) []error {
	p := b.store.client.Pipeline()
	for _, g := range groups {
		if eval {
			g.cmd = script.Eval(ctx, p, g.keys, g.args...)
		} else {
			g.cmd = script.EvalSha(ctx, p, g.keys, g.args...)
		}
	}
	_, execErr := p.Exec(ctx)
	errs := make([]error, len(groups))
	for i, g := range groups {
		if errs[i] = g.cmd.Err(); errs[i] == nil && execErr != nil && g.cmd.Val() == nil {
			errs[i] = execErr
		}
	}
	return errs
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag, or of the whole key without one, modulo 16384.
func Slot(key string) int {
	if tag := HashTag(key); tag != "" {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for j := 0; j < 8; j++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
