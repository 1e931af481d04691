package limiter

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// errBatcherClosed answers calls queued when the store closes.
var errBatcherClosed = errors.New("redis store closed")

// batcher sends the script calls of concurrent requests to Redis together,
// as one pipeline per batch: one write and one read for the batch instead
// of one round trip per request, for Redis and for this process. Each call
// is still its own atomic script; only the transport is shared. A call
// waits at most for the batch in flight on its worker, and never longer
// than its own deadline.
type batcher struct {
	pipe    func() redis.Pipeliner
	queue   chan *batchOp
	max     int
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// batchOp is one script call waiting for its batch.
type batchOp struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	vals   []int64
	err    error
	done   chan struct{}
}

var opPool = sync.Pool{New: func() any { return &batchOp{done: make(chan struct{}, 1)} }}

// newBatcher starts workers that each run one pipeline at a time.
func newBatcher(newPipe func() redis.Pipeliner, workers, maxBatch int) *batcher {
	b := &batcher{
		pipe:  newPipe,
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

// do runs one script call through a batch.
func (b *batcher) do(ctx context.Context, script *redis.Script, keys []string, args []any) ([]int64, error) {
	op := opPool.Get().(*batchOp)
	op.ctx, op.script, op.keys, op.args, op.vals, op.err = ctx, script, keys, args, nil, nil
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
		vals, err := op.vals, op.err
		op.ctx, op.keys, op.args, op.vals = nil, nil, nil, nil
		opPool.Put(op)
		return vals, err
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

// run sends one batch as a pipeline, retrying NOSCRIPT answers with EVAL
// (which also loads the script for the next batches).
func (b *batcher) run(batch []*batchOp) {
	live := batch[:0:0]
	var deadline time.Time
	for _, op := range batch {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			op.done <- struct{}{}
			continue
		}
		// The batch runs until the latest deadline: an op whose own
		// deadline passes first is abandoned by its caller (see do), and
		// must not cut the batch short for the others.
		if d, ok := op.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	cmds, errs := b.exec(ctx, live, false)
	var retry []*batchOp
	var retryIdx []int
	for i := range cmds {
		if errs[i] != nil && redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
			retry = append(retry, live[i])
			retryIdx = append(retryIdx, i)
		}
	}
	if len(retry) > 0 {
		again, againErrs := b.exec(ctx, retry, true)
		for j, i := range retryIdx {
			cmds[i], errs[i] = again[j], againErrs[j]
		}
	}
	for i, op := range live {
		if errs[i] != nil {
			op.err = errs[i]
		} else {
			op.vals, op.err = cmds[i].Int64Slice()
		}
		op.done <- struct{}{}
	}
}

// exec sends ops as one pipeline. A command's error is its own, or, when
// the pipeline failed before the command got an answer (a dial or AUTH
// error), the pipeline's.
func (b *batcher) exec(ctx context.Context, ops []*batchOp, eval bool) ([]*redis.Cmd, []error) {
	p := b.pipe()
	cmds := make([]*redis.Cmd, len(ops))
	for i, op := range ops {
		if eval {
			cmds[i] = op.script.Eval(ctx, p, op.keys, op.args...)
		} else {
			cmds[i] = op.script.EvalSha(ctx, p, op.keys, op.args...)
		}
	}
	_, execErr := p.Exec(ctx)
	errs := make([]error, len(ops))
	for i, cmd := range cmds {
		if errs[i] = cmd.Err(); errs[i] == nil && execErr != nil && cmd.Val() == nil {
			errs[i] = execErr
		}
	}
	return cmds, errs
}
