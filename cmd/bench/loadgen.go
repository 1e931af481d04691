package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// requestTimeout bounds one request (write and full response) on the wire.
const requestTimeout = 5 * time.Second

// loadSpec describes one load generator run against one site.
type loadSpec struct {
	Addr     string // 127.0.0.1:PORT
	HotKey   string // when set, every request carries this X-Key
	Keys     int    // otherwise X-Key is a random one of Keys keys
	Conns    int
	Warmup   time.Duration // run but not measured
	Duration time.Duration // measured
	// Rate, when > 0, paces requests open loop at Rate req/s across all
	// connections; 0 sends as fast as the connections allow (closed loop).
	Rate float64
	// OnMeasure, if set, is called once when the measured period starts.
	OnMeasure func()
}

// loadResult is what one run measured (the measured period only).
type loadResult struct {
	Generator string
	Elapsed   time.Duration
	Responses uint64 // HTTP responses (any status)
	S2xx      uint64
	S429      uint64
	SOther    uint64 // any other status
	Errors    uint64 // transport errors: dial, write, read, timeout, bad response
	Latency   hist   // from the moment the request was written
	// Sched is, for a paced run, the latency from the moment the request
	// was scheduled (includes waiting for a free connection and timer
	// lateness, as wrk2 measures it); empty for a closed-loop run.
	Sched hist
	// LastErr is one transport error, for diagnostics.
	LastErr string
}

func (r *loadResult) reqPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Responses) / r.Elapsed.Seconds()
}

func (r *loadResult) merge(o *loadResult) {
	r.Responses += o.Responses
	r.S2xx += o.S2xx
	r.S429 += o.S429
	r.SOther += o.SOther
	r.Errors += o.Errors
	r.Latency.merge(&o.Latency)
	r.Sched.merge(&o.Sched)
	if o.LastErr != "" {
		r.LastErr = o.LastErr
	}
}

// runGoLoad drives spec.Addr with spec.Conns keep-alive HTTP/1.1 connections,
// one goroutine each, speaking raw HTTP/1.1 (much cheaper than net/http's
// client, so the generator takes as little CPU from the server as possible).
func runGoLoad(ctx context.Context, spec loadSpec) loadResult {
	start := time.Now()
	measureStart := start.Add(spec.Warmup)
	end := measureStart.Add(spec.Duration)

	var (
		wg      sync.WaitGroup
		results = make([]loadResult, spec.Conns)
		next    atomic.Int64 // paced: index of the next scheduled request
	)
	var interval time.Duration
	if spec.Rate > 0 {
		interval = time.Duration(float64(time.Second) / spec.Rate)
		if interval <= 0 {
			interval = 1
		}
	}
	host := "Host: " + spec.Addr + "\r\n"
	for i := range spec.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cleanup.Repanic()
			w := worker{
				spec: spec, host: host, res: &results[i],
				rng:          rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i))),
				measureStart: measureStart, end: end,
			}
			w.loop(ctx, start, interval, &next)
			w.close()
		}()
	}
	if spec.OnMeasure != nil {
		t := time.NewTimer(time.Until(measureStart))
		select {
		case <-t.C:
			spec.OnMeasure()
		case <-ctx.Done():
			t.Stop()
		}
	}
	wg.Wait()

	out := loadResult{Generator: "go"}
	for i := range results {
		out.merge(&results[i])
	}
	out.Elapsed = spec.Duration
	if ctx.Err() != nil {
		out.Elapsed = max(time.Since(measureStart), 0)
	}
	return out
}

type worker struct {
	spec         loadSpec
	host         string
	res          *loadResult
	rng          *rand.Rand
	measureStart time.Time
	end          time.Time

	conn net.Conn
	br   *bufio.Reader
	buf  []byte
}

func (w *worker) loop(ctx context.Context, start time.Time, interval time.Duration, next *atomic.Int64) {
	for ctx.Err() == nil {
		var sched time.Time
		if interval > 0 {
			i := next.Add(1) - 1
			sched = start.Add(time.Duration(i) * interval)
			if !sched.Before(w.end) {
				return
			}
			if d := time.Until(sched); d > 0 {
				time.Sleep(d)
			}
		}
		sent := time.Now()
		if !sent.Before(w.end) {
			return
		}
		measured := !sent.Before(w.measureStart)
		status, err := w.do(sent)
		if err != nil {
			if measured {
				w.res.Errors++
				w.res.LastErr = err.Error()
			}
			// Do not spin on a dead server.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !measured {
			continue
		}
		done := time.Now()
		w.res.Responses++
		switch {
		case status >= 200 && status < 300:
			w.res.S2xx++
		case status == 429:
			w.res.S429++
		default:
			w.res.SOther++
		}
		w.res.Latency.record(done.Sub(sent))
		if interval > 0 {
			w.res.Sched.record(done.Sub(sched))
		}
	}
}

// do sends one request and reads its response, (re)connecting as needed.
func (w *worker) do(now time.Time) (int, error) {
	if w.conn == nil {
		c, err := net.DialTimeout("tcp", w.spec.Addr, requestTimeout)
		if err != nil {
			return 0, err
		}
		w.conn = c
		w.br = bufio.NewReaderSize(c, 16<<10)
	}
	w.buf = append(w.buf[:0], "GET / HTTP/1.1\r\n"...)
	w.buf = append(w.buf, w.host...)
	w.buf = append(w.buf, "User-Agent: sliding-ratelimit-bench\r\nX-Key: "...)
	if w.spec.HotKey != "" {
		w.buf = append(w.buf, w.spec.HotKey...)
	} else {
		w.buf = append(w.buf, 'k')
		w.buf = strconv.AppendInt(w.buf, int64(w.rng.IntN(max(w.spec.Keys, 1))), 10)
	}
	w.buf = append(w.buf, "\r\n\r\n"...)

	_ = w.conn.SetDeadline(now.Add(requestTimeout))
	if _, err := w.conn.Write(w.buf); err != nil {
		w.close()
		return 0, err
	}
	status, keep, err := readResponse(w.br)
	if err != nil {
		w.close()
		return 0, err
	}
	if !keep {
		w.close()
	}
	return status, nil
}

func (w *worker) close() {
	if w.conn != nil {
		_ = w.conn.Close()
		w.conn, w.br = nil, nil
	}
}

var errBadResponse = errors.New("malformed HTTP response")

// readResponse reads one HTTP/1.1 response, discarding its body, and returns
// its status and whether the connection may be reused.
func readResponse(br *bufio.Reader) (status int, keepAlive bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	keepAlive = line[7] == '1' // HTTP/1.1 keeps alive by default
	contentLength := int64(-1)
	chunked := false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			return 0, false, fmt.Errorf("%w: header line %q", errBadResponse, line)
		}
		name, value := line[:colon], bytes.TrimSpace(line[colon+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			contentLength, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil || contentLength < 0 {
				return 0, false, fmt.Errorf("%w: Content-Length %q", errBadResponse, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			v := bytes.ToLower(value)
			if bytes.Contains(v, []byte("close")) {
				keepAlive = false
			} else if bytes.Contains(v, []byte("keep-alive")) {
				keepAlive = true
			}
		}
	}
	switch {
	case status == 204 || status == 304 || (status >= 100 && status < 200):
		// no body
	case chunked:
		if err := discardChunked(br); err != nil {
			return 0, false, err
		}
	case contentLength >= 0:
		if _, err := br.Discard(int(contentLength)); err != nil {
			return 0, false, err
		}
	default:
		// Body until close: read it all, the connection is done.
		if _, err := io.Copy(io.Discard, br); err != nil {
			return 0, false, err
		}
		keepAlive = false
	}
	return status, keepAlive, nil
}

func discardChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("%w: chunk size %q", errBadResponse, line)
		}
		if size == 0 {
			// Trailers, then the empty line.
			for {
				t, err := br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(t, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := br.Discard(int(size) + 2); err != nil {
			return err
		}
	}
}
