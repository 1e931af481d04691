package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// overrideInfo is an override in the admin API's answers.
type overrideInfo struct {
	Region       string  `json:"region,omitempty"`
	Factor       float64 `json:"factor,omitempty"`
	Limits       []int64 `json:"limits,omitempty"`
	GlobalLimits []int64 `json:"global_limits,omitempty"`
	// TTL is what is left of it, in whole seconds (rounded up).
	TTL int64 `json:"ttl"`
}

func toOverrideInfo(o limiter.Override) overrideInfo {
	return overrideInfo{Region: o.Region, Factor: o.Factor, Limits: o.Limits, GlobalLimits: o.GlobalLimits, TTL: ceilSeconds(o.TTL)}
}

// serveOverride answers /sliding_ratelimit/<name>/override:
//
//	PUT    ?key=K[&region=R]&ttl=1h&factor=2          K's limits times 2 for an hour
//	PUT    ?key=K[&region=R]&ttl=1h&limit=500[,...]    K's limits (in the windows' order)
//	       [&global_limit=...]                         and its global ceiling's
//	GET    ?key=K                                      K's live overrides
//	GET                                                every live override of the limiter
//	DELETE ?key=K[&region=R]                           end K's override early
//
// The override is kept in the store with its TTL: every node applies it on
// K's next request, and it ends by itself.
func serveOverride(w http.ResponseWriter, r *http.Request, name string, h *Handler) error {
	q := r.URL.Query()
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	storeErr := func(err error) error {
		if errors.Is(err, limiter.ErrInput) {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("store: %w", err)}
	}
	if !q.Has("key") {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("query parameter 'key' is required (the identity, as the key template resolves)")}
		}
		list, err := h.rt.lim.ActiveOverrides(ctx)
		if err != nil {
			return storeErr(err)
		}
		// The key as it stands in the store's keys (itself when short and
		// plain) only with log_key; its key_hash always.
		type entry struct {
			Key     string `json:"key,omitempty"`
			KeyHash string `json:"key_hash"`
			Region  string `json:"region,omitempty"`
			TTL     int64  `json:"ttl"`
		}
		out := make([]entry, 0, len(list))
		for _, e := range list {
			x := entry{KeyHash: e.KeyHash, Region: e.Region, TTL: ceilSeconds(e.Left)}
			if h.LogKey {
				x.Key = e.Identity
			}
			out = append(out, x)
		}
		return writeJSON(w, map[string]any{"limiter": name, "overrides": out})
	}
	key, region := q.Get("key"), q.Get("region")
	switch r.Method {
	case http.MethodGet:
		os, err := h.rt.lim.Overrides(ctx, key)
		if err != nil {
			return storeErr(err)
		}
		out := make([]overrideInfo, 0, len(os))
		for _, o := range os {
			out = append(out, toOverrideInfo(o))
		}
		return writeJSON(w, map[string]any{"limiter": name, "key": key, "key_hash": keyHash(key), "overrides": out})
	case http.MethodPut, http.MethodPost:
		o, err := parseOverride(q)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		got, err := h.rt.lim.SetOverride(ctx, key, o)
		if err != nil {
			return storeErr(err)
		}
		h.logOverride("rate limit override set", key, region, zap.Float64("factor", got.Factor),
			zap.Int64s("limits", got.Limits), zap.Int64s("global_limits", got.GlobalLimits), zap.Duration("ttl", got.TTL))
		return writeJSON(w, map[string]any{"limiter": name, "key": key, "key_hash": keyHash(key), "override": toOverrideInfo(got)})
	case http.MethodDelete:
		had, err := h.rt.lim.DeleteOverride(ctx, key, region)
		if err != nil {
			return storeErr(err)
		}
		h.logOverride("rate limit override ended", key, region, zap.Bool("was_live", had))
		return writeJSON(w, map[string]any{"limiter": name, "key": key, "key_hash": keyHash(key), "region": region, "ended": had})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("GET, PUT or DELETE")}
}

// parseOverride reads an override from the query: ttl, and factor or
// limit / global_limit.
func parseOverride(q url.Values) (limiter.Override, error) {
	o := limiter.Override{Region: q.Get("region")}
	ttl := q.Get("ttl")
	if ttl == "" {
		return o, errors.New("query parameter 'ttl' is required: how long the override lasts (e.g. 30m, 2h, 7d)")
	}
	d, err := caddy.ParseDuration(ttl)
	if err != nil {
		return o, fmt.Errorf("ttl '%s': %v", ttl, err)
	}
	o.TTL = d
	if f := q.Get("factor"); f != "" {
		o.Factor, err = strconv.ParseFloat(f, 64)
		if err != nil || o.Factor <= 0 {
			return o, fmt.Errorf("factor '%s' is not a positive number", f)
		}
	}
	list := func(param string) ([]int64, error) {
		if !q.Has(param) {
			return nil, nil
		}
		var out []int64
		for _, v := range strings.Split(q.Get(param), ",") {
			n, err := parsePositive(v)
			if err != nil {
				return nil, fmt.Errorf("%s '%s': each value must be a whole number from 1 to 2^50", param, q.Get(param))
			}
			out = append(out, n)
		}
		return out, nil
	}
	if o.Limits, err = list("limit"); err != nil {
		return o, err
	}
	if o.GlobalLimits, err = list("global_limit"); err != nil {
		return o, err
	}
	return o, nil
}

// logOverride logs an override change: the key itself only with log_key.
func (h *Handler) logOverride(msg, key, region string, fields ...zap.Field) {
	fields = append([]zap.Field{zap.String("limiter", h.Name), zap.String("key_hash", keyHash(key)), zap.String("region", region)}, fields...)
	if h.LogKey {
		fields = append(fields, zap.String("key", key))
	}
	h.rt.logger.Info(msg, fields...)
}
