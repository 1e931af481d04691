package slidingratelimit

import (
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// ServeHTTP resolves the request's key, region, limits and cost, asks the
// engine once, and renders its decision: the next handler (with the rate
// limit headers), or the refusal (429, 413, 503) the decision calls for. A
// limit, cost or max_concurrent placeholder that does not resolve to a
// positive integer is a 500: never "unlimited".
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (err error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	ph := placeholders(r.Context(), repl)
	var in limiter.Input
	limits, scratch := ph.scratch()
	in.Scratch = scratch
	var hdr http.Header
	if ph.inServer {
		hdr = r.Header
	}
	if err := h.resolve(repl, hdr, &in, limits); err != nil {
		return h.badAmount(err)
	}
	d, err := h.rt.lim.Decide(r.Context(), &in)
	if err != nil {
		return h.badAmount(err)
	}
	h.observe(ph, &d)
	h.trace(r.Context(), &d)
	if !d.Pass {
		return h.refuse(w, r, &d, ph.valsBuf())
	}
	if d.Outcome != limiter.OutcomeUnavailable {
		// Headers say what a store decided: none when none did (fail open).
		h.rt.headers.WriteInto(w.Header(), &d, ph.valsBuf())
	}
	switch {
	case h.rt.statusIn != nil:
		// count_only: the units are recorded after the response, by its
		// status, whatever happens (an error, a panic, a client gone).
		rec := &statusRecorder{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
		defer func() {
			if p := recover(); p != nil {
				h.rt.lim.Done(r.Context(), &d, http.StatusInternalServerError)
				panic(p)
			}
			h.rt.lim.Done(r.Context(), &d, rec.final(err))
		}()
		return next.ServeHTTP(rec, r)
	case h.MaxConcurrent != "":
		// The lease goes back when the handler chain returns, whatever
		// happens.
		defer h.rt.lim.Done(r.Context(), &d, 0)
	}
	return next.ServeHTTP(w, r)
}

// resolve fills in the request's Input from the placeholders. buf backs
// the limits (the request's placeholder state, see scratch), so a request
// allocates nothing of its own for them. hdr, when set, is the header of a
// request Caddy's server prepared (see key).
func (h *Handler) resolve(repl *caddy.Replacer, hdr http.Header, in *limiter.Input, buf []int64) error {
	in.Identity = h.key(repl, hdr)
	if h.rt.keyTmpl.empty(in.Identity) {
		h.emptyKey(repl)
	}
	if h.Region != "" {
		in.Region = h.rt.regionTmpl.expand(repl)
	}
	for i := range h.rt.limits {
		v, err := h.rt.limits[i].resolve(repl, "limit")
		if err != nil {
			return err
		}
		buf = append(buf, v)
	}
	in.Limits = buf[:len(h.rt.limits)]
	for i := range h.rt.globals {
		v, err := h.rt.globals[i].resolve(repl, "global_limit")
		if err != nil {
			return err
		}
		buf = append(buf, v)
	}
	in.GlobalLimits = buf[len(h.rt.limits):]
	var err error
	if in.Cost, err = h.rt.cost.resolve(repl, "cost"); err != nil {
		return err
	}
	if h.MaxConcurrent != "" {
		if in.MaxConcurrent, err = h.rt.concurrent.resolve(repl, "max_concurrent"); err != nil {
			return err
		}
	}
	return nil
}

// key is the request's identity: the key template expanded. A key that is
// just {http.request.header.<field>} is read from hdr, when given, as
// Caddy's placeholder reads it (the field's values joined by ","), without
// asking the replacer, which walks its providers to Caddy's HTTP one and
// boxes the value. Caddy's server gives that provider the request it
// prepared, whose header map every handler's request shares.
func (h *Handler) key(repl *caddy.Replacer, hdr http.Header) string {
	if hdr != nil && h.rt.keyHeader != "" {
		return reply.HeaderKey(hdr, h.rt.keyHeader)
	}
	return h.rt.keyTmpl.expand(repl)
}

// badAmount answers 500 for a placeholder that did not resolve to a
// positive integer, and logs which one (once per burst).
func (h *Handler) badAmount(err error) error {
	if ok, suppressed := h.rt.logs.config.allow(time.Now()); ok {
		h.rt.logger.Error("dynamic rate limit value is not a positive integer; answering 500",
			zap.String("limiter", h.Name),
			zap.Int64("suppressed_since_last_log", suppressed),
			zap.Error(err))
	}
	return caddyhttp.Error(http.StatusInternalServerError, err)
}

// statusRecorder remembers the status a response was written with.
type statusRecorder struct {
	*caddyhttp.ResponseWriterWrapper
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriterWrapper.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriterWrapper.Write(b)
}

// final is the response's status: as written, or the status of the error
// the chain returned (Caddy's error handling writes it), or 200.
func (s *statusRecorder) final(err error) int {
	if s.status != 0 {
		return s.status
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	if err != nil {
		return http.StatusInternalServerError
	}
	return http.StatusOK
}
