package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/netproxy"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// world is the data centres on loopback: a ledger redis-server, and per
// data centre its own redis-server and a netproxy in front of the ledger
// (delay each way). Nodes are made per run (node).
type world struct {
	ledger *redistest.Proc
	dcs    []*datacenter
	stops  []func() // in reverse order by close
}

type datacenter struct {
	name  string
	srv   *redistest.Proc
	proxy *netproxy.Proxy
	lc    *redis.Client // to the ledger, through proxy
	lg    *limiter.Ledger
}

// newWorld starts n data centres and the ledger, delay each way between
// every data centre and the ledger. On error what was started is stopped.
func newWorld(n int, delay time.Duration) (w *world, err error) {
	w = &world{}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if w.ledger, err = redistest.Launch(redistest.LaunchOptions{}); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	w.stops = append(w.stops, w.ledger.Stop)
	for i := range n {
		dc := &datacenter{name: fmt.Sprintf("dc%d", i)}
		if dc.srv, err = redistest.Launch(redistest.LaunchOptions{}); err != nil {
			return nil, fmt.Errorf("%s: %w", dc.name, err)
		}
		w.stops = append(w.stops, dc.srv.Stop)
		if dc.proxy, err = netproxy.New(w.ledger.Addr()); err != nil {
			return nil, fmt.Errorf("%s: proxy to the ledger: %w", dc.name, err)
		}
		w.stops = append(w.stops, func() { _ = dc.proxy.Close() })
		dc.proxy.SetDelay(delay, delay)
		// As the plugin's clients are: no retries, the context's deadline.
		dc.lc = redis.NewClient(&redis.Options{Addr: dc.proxy.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true,
			Protocol: 2, DisableIdentity: true, DialTimeout: time.Second})
		w.stops = append(w.stops, func() { _ = dc.lc.Close() })
		dc.lg = limiter.NewLedger(dc.lc)
		w.dcs = append(w.dcs, dc)
	}
	return w, nil
}

// close stops everything newWorld started, last first.
func (w *world) close() {
	for i := len(w.stops) - 1; i >= 0; i-- {
		w.stops[i]()
	}
	w.stops = nil
}

// node is one engine node of a data centre: a Limiter over the data
// centre's redis-server with the store stack the plugin builds (a Redis
// store with pipelining, a breaker), with the global ceiling in the ledger
// (global) or in the data centre's own store (as one data centre keeps it).
type node struct {
	dc     *datacenter
	l      *limiter.Limiter
	closes []func()

	mu     sync.Mutex
	events map[limiter.GlobalEventKind]int
	rtt    time.Duration // the ledger's round trips, summed (EventGrant)
	empty  int           // ledger answers that granted nothing
}

func newNode(dc *datacenter, p limiter.Policy, global bool) (*node, error) {
	n := &node{dc: dc, events: map[limiter.GlobalEventKind]int{}}
	c := redis.NewClient(&redis.Options{Addr: dc.srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true,
		Protocol: 2, DisableIdentity: true, DialTimeout: time.Second,
		ReadTimeout: p.Timeout, WriteTimeout: p.Timeout, PoolTimeout: p.Timeout})
	s := limiter.NewRedisStore(c, limiter.WithBatching(2, 64))
	n.closes = append(n.closes, func() { _ = c.Close() }, func() { _ = s.Close() })
	br := limiter.NewBreaker(s, limiter.BreakerConfig{IsFailure: limiter.IsUnavailable})
	b := limiter.Backend{Store: br, Base: s, Source: limiter.SourceRedis, Remote: true, Notifier: s}
	if global {
		b.Global = &limiter.Global{Ledger: dc.lg, Datacenter: dc.name, OnEvent: n.event}
	}
	l, err := limiter.New(p, b)
	if err != nil {
		n.close()
		return nil, err
	}
	n.l = l
	n.closes = append(n.closes, l.Close)
	return n, nil
}

func (n *node) event(ev limiter.GlobalEvent) {
	n.mu.Lock()
	n.events[ev.Kind]++
	if ev.Kind == limiter.EventGrant {
		n.rtt += ev.Took
		if ev.Units == 0 {
			n.empty++
		}
	}
	n.mu.Unlock()
}

func (n *node) close() {
	for i := len(n.closes) - 1; i >= 0; i-- {
		n.closes[i]()
	}
	n.closes = nil
}

// flush empties every server (between runs).
func (w *world) flush() error {
	var errs []error
	for _, p := range append([]*redistest.Proc{w.ledger}, w.servers()...) {
		c := p.NewClient()
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			errs = append(errs, fmt.Errorf("FLUSHALL %s: %w", p.Addr(), err))
		}
		_ = c.Close()
	}
	return errors.Join(errs...)
}

func (w *world) servers() []*redistest.Proc {
	var s []*redistest.Proc
	for _, dc := range w.dcs {
		s = append(s, dc.srv)
	}
	return s
}
