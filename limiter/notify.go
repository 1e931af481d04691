package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Notifier carries notices (a reset, a lifted ban) to every process that
// shares a store, so each drops what it cached about the key.
type Notifier interface {
	// Publish sends msg on channel to every subscriber, this process's too.
	Publish(ctx context.Context, channel, msg string) error
	// Subscribe calls f with every msg published on channel, and with ""
	// whenever the subscription starts again after a break (notices may
	// have been missed meanwhile). cancel ends it.
	Subscribe(channel string, f func(msg string)) (cancel func())
}

// listeners is a set of callbacks per channel.
type listeners struct {
	mu   sync.Mutex
	next int
	m    map[string]map[int]func(string)
}

// add registers f on channel; it reports whether channel is new.
func (l *listeners) add(channel string, f func(string)) (id int, isNew bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string]map[int]func(string))
	}
	if l.m[channel] == nil {
		l.m[channel] = make(map[int]func(string))
		isNew = true
	}
	l.next++
	l.m[channel][l.next] = f
	return l.next, isNew
}

func (l *listeners) remove(channel string, id int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m[channel], id)
}

func (l *listeners) deliver(channel, msg string) {
	l.mu.Lock()
	fs := make([]func(string), 0, len(l.m[channel]))
	for _, f := range l.m[channel] {
		fs = append(fs, f)
	}
	l.mu.Unlock()
	for _, f := range fs {
		f(msg)
	}
}

// Publish implements Notifier for one process.
func (s *MemoryStore) Publish(_ context.Context, channel, msg string) error {
	s.bus.deliver(channel, msg)
	return nil
}

// Subscribe implements Notifier for one process.
func (s *MemoryStore) Subscribe(channel string, f func(string)) func() {
	id, _ := s.bus.add(channel, f)
	return func() { s.bus.remove(channel, id) }
}

// notifier is the Redis store's pub/sub: one subscription per store, to
// every channel a limiter asked for, read by one goroutine that reconnects
// with a backoff (100 ms, doubling to 5 s) so an outage costs a dial per
// backoff, not a dial (and a go-redis log line) every 100 ms.
type notifier struct {
	store *RedisStore
	subs  listeners
	mu    sync.Mutex
	ps    *redis.PubSub
	done  chan struct{}
}

// Publish implements Notifier.
func (s *RedisStore) Publish(ctx context.Context, channel, msg string) error {
	return s.client.Publish(ctx, channel, msg).Err()
}

// Subscribe implements Notifier.
func (s *RedisStore) Subscribe(channel string, f func(string)) func() {
	n := &s.notify
	id, isNew := n.subs.add(channel, f)
	if isNew {
		n.mu.Lock()
		if n.ps == nil {
			n.ps = s.client.Subscribe(context.Background())
			n.done = make(chan struct{})
			go n.read(n.ps, n.done)
		}
		ps := n.ps
		n.mu.Unlock()
		// Subscribing sends a command on the subscription's connection
		// (or dials it); an error here is retried by the reader.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = ps.Subscribe(ctx, channel)
		cancel()
	}
	return func() { n.subs.remove(channel, id) }
}

func (n *notifier) read(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	backoff := 100 * time.Millisecond
	for {
		msg, err := ps.Receive(context.Background())
		if err != nil {
			if err == redis.ErrClosed {
				return
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			n.subs.deliver(m.Channel, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n.subs.deliver(m.Channel, "")
			}
		}
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	ps, done := n.ps, n.done
	n.ps = nil
	n.mu.Unlock()
	if ps != nil {
		ps.Close()
		<-done
	}
}
