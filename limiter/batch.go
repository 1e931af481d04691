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
// each with its own reply; on a cluster the calls of one batch go in one
// pipeline. One write and one read per batch instead of per request, and
// one script call per slot instead of per request. A call waits at most for
// the batch in flight on its worker, and never past its own deadline.
//
// A batch allocates little: each check is encoded into its pooled batchOp,
// and each worker reuses its argument list, its reply buffer and its
// context from one batch to the next.
type batcher struct {
	store   *RedisStore
	queue   chan *batchOp
	max     int
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// batchOp is one check waiting for its batch. It is pooled: it goes back to
// the pool only once its caller has the answer. A caller that gives up
// leaves it to its worker (and then to the garbage collector), so a worker
// never writes into a batchOp another call is using.
type batchOp struct {
	ctx   context.Context
	until time.Time // when the caller gives up: the earliest of ctx's deadline and the Op's (zero: neither)
	c     check
	slot  int
	vals  []int64 // the check's reply values, when err is nil
	time  int64   // the call's reading of Redis TIME (µs), 0 for none
	err   error
	done  chan struct{}
	timer *time.Timer // fires at until; kept with the batchOp
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
				op.answer(errBatcherClosed)
			default:
				return
			}
		}
	})
}

// do runs op through a batch (deadline is op's on Redis's clock) and reads
// its reply. It gives up at op.Deadline and at ctx's deadline, whichever
// comes first.
func (b *batcher) do(ctx context.Context, op *Op, deadline int64, sent time.Time) (Reply, error) {
	bo := opPool.Get().(*batchOp)
	bo.ctx, bo.err, bo.vals = ctx, nil, bo.vals[:0]
	bo.c.encode(op, deadline, b.store.format)
	bo.slot = 0
	if b.store.cluster {
		bo.slot = Slot(bo.c.keys[0])
	}
	bo.until = op.Deadline
	if d, ok := ctx.Deadline(); ok && (bo.until.IsZero() || d.Before(bo.until)) {
		bo.until = d
	}
	var expired <-chan time.Time
	if !bo.until.IsZero() {
		expired = bo.arm(sent)
	}
	select {
	case b.queue <- bo:
	case <-ctx.Done():
		bo.release()
		return Reply{}, ctx.Err()
	case <-expired:
		bo.release()
		return Reply{}, context.DeadlineExceeded
	case <-b.stop:
		bo.release()
		return Reply{}, errBatcherClosed
	}
	select {
	case <-bo.done:
		defer bo.release()
		if bo.err != nil {
			return Reply{}, bo.err
		}
		return b.store.reply(bo.vals, bo.time, op, sent)
	case <-ctx.Done():
		// The worker still owns bo and will answer into its buffered
		// channel; bo is not reused.
		return Reply{}, ctx.Err()
	case <-expired:
		return Reply{}, context.DeadlineExceeded
	}
}

// arm starts bo's timer for until, counted from now (the Op's send time,
// read just before: no clock reading of its own), and returns its channel.
func (bo *batchOp) arm(now time.Time) <-chan time.Time {
	if bo.timer == nil {
		bo.timer = time.NewTimer(bo.until.Sub(now))
	} else {
		bo.timer.Reset(bo.until.Sub(now))
	}
	return bo.timer.C
}

// release puts bo back in the pool, its timer stopped.
func (bo *batchOp) release() {
	if bo.timer != nil && !bo.timer.Stop() {
		select {
		case <-bo.timer.C:
		default:
		}
	}
	bo.ctx, bo.err = nil, nil
	bo.c.clear()
	opPool.Put(bo)
}

// expired is the error of a check whose caller has given up, nil while it
// waits.
func (bo *batchOp) expired(now time.Time) error {
	if err := bo.ctx.Err(); err != nil {
		return err
	}
	if !bo.until.IsZero() && !now.Before(bo.until) {
		return context.DeadlineExceeded
	}
	return nil
}

// answer hands bo back to its caller with err (nil: bo.vals).
func (bo *batchOp) answer(err error) {
	bo.err = err
	bo.done <- struct{}{}
}

// worker is what one worker keeps from one batch to the next (buffers,
// context, pipeline), so that a batch allocates little beyond its command.
type worker struct {
	b     *batcher
	ctx   *batchCtx
	batch []*batchOp
	args  []any    // the script call's arguments
	base  [2]int64 // its bases of deadlines and nows (bases)
	reply rawReply // its reply, off a cluster
	// On a cluster: a script call per slot, in one pipeline.
	groups []group
	pipe   redis.Pipeliner
}

func (b *batcher) work() {
	defer b.stopped.Done()
	w := b.newWorker()
	defer w.ctx.close()
	for {
		w.batch = w.batch[:0]
		select {
		case op := <-b.queue:
			w.batch = append(w.batch, op)
		case <-b.stop:
			return
		}
	fill:
		for len(w.batch) < b.max {
			select {
			case op := <-b.queue:
				w.batch = append(w.batch, op)
			default:
				break fill
			}
		}
		w.run(w.batch)
	}
}

func (b *batcher) newWorker() *worker {
	return &worker{b: b, ctx: newBatchCtx(), batch: make([]*batchOp, 0, b.max)}
}

// run sends one batch and answers its checks.
func (w *worker) run(batch []*batchOp) {
	now := time.Now()
	live := batch[:0]
	var deadline time.Time
	unbounded := false
	for _, op := range batch {
		if err := op.expired(now); err != nil {
			op.answer(err)
			continue
		}
		// The batch runs until the latest deadline of its checks, and
		// without one when a check has none: a check is never cut short
		// by a neighbour's deadline (its own caller stops waiting at its
		// own; see do).
		if op.until.IsZero() {
			unbounded = true
		} else if op.until.After(deadline) {
			deadline = op.until
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	if unbounded {
		deadline = time.Time{}
	}
	w.ctx.start(deadline)
	if w.b.store.cluster {
		w.runSlots(live)
	} else {
		w.runOne(live)
	}
	w.ctx.end()
	for _, op := range live {
		op.done <- struct{}{}
	}
}

// runOne sends the checks in one script call and reads its raw reply,
// sending it again as the store's retry says (the library loaded after
// "function not found", EVAL after NOSCRIPT).
func (w *worker) runOne(ops []*batchOp) {
	cmd, name, loads := w.b.store.head(w.ctx, allPeek(ops), allLog(ops), allFast(ops))
	args := append(w.args[:0], cmd, name, 0)
	for _, op := range ops {
		for i := range op.c.keys {
			args = append(args, &op.c.keys[i])
		}
	}
	args[2] = len(args) - 3
	var b bases
	for _, op := range ops {
		b.add(&op.c)
	}
	w.base = [2]int64{b.deadlineBase(), b.nowBase()}
	args = append(args, len(ops), &w.base[0], &w.base[1])
	for _, op := range ops {
		op.c.relative(&b)
		args = append(args, op.c.args...)
	}
	w.args = args
	err := w.call(args)
	for tries := 0; tries < 2; tries++ {
		again := false
		if again, err = w.b.store.retry(w.ctx, err, args, loads); !again {
			break
		}
		err = w.call(args)
	}
	if err == nil {
		err = readReplies(w.reply.b, ops)
	}
	if err != nil {
		for _, op := range ops {
			op.err = err
		}
	}
	clear(w.args) // the keys and values of requests gone
}

// allLog reports whether every check of ops is one lua.DecideLog decides.
func allLog(ops []*batchOp) bool {
	for _, op := range ops {
		if !op.c.log {
			return false
		}
	}
	return true
}

// allFast is the kind of lua.DecideFast's script that takes every check
// of ops, or 0.
func allFast(ops []*batchOp) Kind {
	var k Kind
	for i, op := range ops {
		if i == 0 {
			k = op.c.fast
		} else if op.c.fast != k {
			return 0
		}
	}
	return k
}

// allPeek reports whether every check of ops only peeks (FCALL_RO).
func allPeek(ops []*batchOp) bool {
	for _, op := range ops {
		if !op.c.peek {
			return false
		}
	}
	return true
}

// call runs one script call, its raw reply into w.reply.
func (w *worker) call(args []any) error {
	w.reply.b = w.reply.b[:0]
	return w.b.store.client.Process(w.ctx, redis.NewRawWriteToCmd(w.ctx, &w.reply, args...))
}

// group is the checks of one slot: one script call.
type group struct {
	ops  []*batchOp
	args []any
	base [2]int64 // its bases of deadlines and nows (bases)
	cmd  *redis.Cmd
	err  error
	send bool // exec sends it
}

// runSlots sends a script call per slot, all in one pipeline, sending
// calls again as the store's retry says (the library loaded after
// "function not found", EVAL after NOSCRIPT), at most twice.
func (w *worker) runSlots(ops []*batchOp) {
	loads := w.b.store.scripts.loads.Load()
	groups := w.groupBySlot(ops)
	for i := range groups {
		groups[i].send = true
	}
	w.exec(groups)
	for tries := 0; tries < 2; tries++ {
		retry := false
		for i := range groups {
			g := &groups[i]
			g.send, g.err = w.b.store.retry(w.ctx, g.err, g.args, loads)
			retry = retry || g.send
		}
		if !retry {
			break
		}
		w.exec(groups)
	}
	for i := range groups {
		g := &groups[i]
		err := g.err
		var replies []any
		if err == nil {
			var out any
			out, err = g.cmd.Result()
			if l, ok := out.([]any); ok {
				replies = l
			} else if err == nil {
				err = fmt.Errorf("%w: %T for %d checks", ErrBadReply, out, len(g.ops))
			}
		}
		next := 0
		for _, op := range g.ops {
			if err != nil {
				break
			}
			var bad error
			op.vals, op.err, next, bad = valuesOf(replies[:max(len(replies)-1, 0)], next, op.vals[:0])
			err = bad
		}
		if err == nil {
			var t int64
			if t, err = callTime(replies, next, len(g.ops)); err == nil {
				for _, op := range g.ops {
					op.time = t
				}
			}
		}
		if err != nil {
			for _, op := range g.ops {
				op.err = err
			}
		}
		// Emptied for the next batch, holding on to no request.
		clear(g.ops)
		clear(g.args)
		g.ops, g.args, g.cmd, g.err = g.ops[:0], g.args[:0], nil, nil
	}
}

// groupBySlot puts the checks of each slot in one group, in arrival order,
// each group with its script call's arguments. The groups and their slices
// are the worker's, reused from one batch to the next.
func (w *worker) groupBySlot(ops []*batchOp) []group {
	groups := w.groups[:0]
	for _, op := range ops {
		k := -1
		for i := range groups {
			if groups[i].ops[0].slot == op.slot {
				k = i
				break
			}
		}
		if k < 0 {
			k = len(groups)
			if k < cap(groups) {
				groups = groups[:k+1]
			} else {
				groups = append(groups, group{})
			}
		}
		groups[k].ops = append(groups[k].ops, op)
	}
	for i := range groups {
		g := &groups[i]
		cmd, name, _ := w.b.store.head(w.ctx, allPeek(g.ops), allLog(g.ops), allFast(g.ops))
		args := append(g.args[:0], cmd, name, 0)
		for _, op := range g.ops {
			for j := range op.c.keys {
				args = append(args, &op.c.keys[j])
			}
		}
		args[2] = len(args) - 3
		var b bases
		for _, op := range g.ops {
			b.add(&op.c)
		}
		g.base = [2]int64{b.deadlineBase(), b.nowBase()}
		args = append(args, len(g.ops), &g.base[0], &g.base[1])
		for _, op := range g.ops {
			op.c.relative(&b)
			args = append(args, op.c.args...)
		}
		g.args = args
	}
	w.groups = groups
	return groups
}

// exec sends a script call for each group marked send, as one pipeline. A
// call's error is its own, or, when the pipeline failed before the call got
// an answer (a dial or AUTH error), the pipeline's.
func (w *worker) exec(groups []group) {
	if w.pipe == nil {
		// One pipeline per worker, reused: Exec leaves it empty.
		w.pipe = w.b.store.client.Pipeline()
	}
	for i := range groups {
		if g := &groups[i]; g.send {
			g.cmd = redis.NewCmd(w.ctx, g.args...)
			g.cmd.SetFirstKeyPos(3)
			_ = w.pipe.Process(w.ctx, g.cmd)
		}
	}
	_, execErr := w.pipe.Exec(w.ctx)
	for i := range groups {
		if g := &groups[i]; g.send {
			if g.err = g.cmd.Err(); g.err == nil && execErr != nil && g.cmd.Val() == nil {
				g.err = execErr
			}
		}
	}
}

// batchCtx is a worker's context for its batches, reused from one batch to
// the next so that a batch allocates no context and no timer: like
// context.WithDeadline(context.Background(), deadline), it carries the
// batch's deadline (go-redis sets it on the socket) and is done at that
// deadline (a wait for a connection or a dial gives up then).
type batchCtx struct {
	timer    *time.Timer
	mu       sync.Mutex
	deadline time.Time // zero: none
	done     chan struct{}
	err      error
}

func newBatchCtx() *batchCtx {
	c := &batchCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
	return c
}

// start readies c for a batch that must end by deadline (zero: none).
func (c *batchCtx) start(deadline time.Time) {
	c.mu.Lock()
	if c.err != nil {
		// The last batch ran out of time and closed done.
		c.done, c.err = make(chan struct{}), nil
	}
	c.deadline = deadline
	c.mu.Unlock()
	if !deadline.IsZero() {
		c.timer.Reset(time.Until(deadline))
	}
}

// end ends the batch.
func (c *batchCtx) end() {
	c.timer.Stop()
	c.mu.Lock()
	c.deadline = time.Time{}
	c.mu.Unlock()
}

// close ends c for good.
func (c *batchCtx) close() { c.timer.Stop() }

// expire ends the batch at its deadline. A timer of an earlier batch that
// fires as that batch ends finds no deadline, or one still to come.
func (c *batchCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.deadline.IsZero() || time.Now().Before(c.deadline) {
		return
	}
	c.err = context.DeadlineExceeded
	close(c.done)
}

func (c *batchCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, !c.deadline.IsZero()
}

func (c *batchCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *batchCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *batchCtx) Value(any) any { return nil }

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
