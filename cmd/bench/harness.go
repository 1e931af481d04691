package main

import (
	"fmt"
	"slices"
	"strings"
)

// harness is how a pass drives and configures Caddy, apart from where the
// processes run (its layout). Two settings measure the same sites:
//
//   - bench, this benchmark's own (-conns connections, Caddy's admin
//     endpoint on, its default log level, each limiter at the site's own
//     limit: 10,000 or 10^9 a minute on the many-key sites);
//   - outside, the harness of issue 29's figures taken from outside the
//     repository: pinned only, 32 connections, one load thread, admin off,
//     log level ERROR, and every many-key limiter, ours as the peer's, at
//     100 a second.
//
// Between them, three settings each change one choice of bench's to
// outside's, pinned only, to find which of them moves a ratio in one run:
// conns32 (32 connections), quiet (admin off, log level ERROR) and rate100
// (our many-key limits at 100 a second). The flags -admin, -log-level and
// -rate change the bench setting itself.
type harness struct {
	Name string
	// Conns is the load's connections.
	Conns int
	// Admin: Caddy's admin endpoint on a loopback port ("admin off" when
	// false).
	Admin bool
	// LogLevel is Caddy's default logger's level ("" leaves Caddy's INFO).
	LogLevel string
	// Rate, when set ("100/1s"), is the limit and window of every many-key
	// limiter of ours (the sites' own otherwise); the peer's zone is
	// always 100 events a second.
	Rate string
	// PinnedOnly: the setting runs in the pinned layout alone.
	PinnedOnly bool
}

// outsideHarness is issue 29's outside harness.
var outsideHarness = harness{Name: "outside", Conns: 32, Admin: false, LogLevel: "ERROR", Rate: "100/1s", PinnedOnly: true}

// benchHarness is this benchmark's own setting, from the flags.
func benchHarness(o *options) harness {
	return harness{Name: "bench", Conns: o.conns, Admin: o.admin, LogLevel: o.logLevel, Rate: o.rate}
}

// describe says in words what the setting is.
func (h harness) describe() string {
	admin := "admin on"
	if !h.Admin {
		admin = "admin off"
	}
	level := "Caddy's default log level"
	if h.LogLevel != "" {
		level = "log level " + h.LogLevel
	}
	rate := "each site's own limit"
	if h.Rate != "" {
		rate = "many-key limits " + h.Rate
	}
	return fmt.Sprintf("%d connections, %s, %s, %s", h.Conns, admin, level, rate)
}

// harnessNames are the settings -harness knows, in the order they run.
var harnessNames = []string{"bench", "conns32", "quiet", "rate100", "outside"}

// harnessByName is the setting of that name, from the bench one.
func harnessByName(name string, o *options) harness {
	h := benchHarness(o)
	switch name {
	case "outside":
		return outsideHarness
	case "conns32":
		h.Conns = outsideHarness.Conns
	case "quiet":
		h.Admin, h.LogLevel = outsideHarness.Admin, outsideHarness.LogLevel
	case "rate100":
		h.Rate = outsideHarness.Rate
	}
	if name != "bench" {
		h.Name, h.PinnedOnly = name, true
	}
	return h
}

// selectHarnesses parses -harness: "all" (bench and outside), "sweep" (every
// setting), or a comma-separated list of them. The result keeps
// harnessNames' order.
func selectHarnesses(flagVal string, o *options) ([]harness, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(flagVal, ",") {
		switch n = strings.TrimSpace(n); n {
		case "":
		case "all":
			want["bench"], want["outside"] = true, true
		case "sweep":
			for _, k := range harnessNames {
				want[k] = true
			}
		default:
			if !slices.Contains(harnessNames, n) {
				return nil, fmt.Errorf("unknown harness %q in -harness (known: %s, all, sweep)", n, strings.Join(harnessNames, ", "))
			}
			want[n] = true
		}
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("-harness selects no setting")
	}
	var hs []harness
	for _, n := range harnessNames {
		if want[n] {
			hs = append(hs, harnessByName(n, o))
		}
	}
	return hs, nil
}

// parseRate checks a -rate value: LIMIT/WINDOW, as "100/1s".
func parseRate(s string) (limit, window string, err error) {
	limit, window, ok := strings.Cut(s, "/")
	if !ok || limit == "" || window == "" || strings.ContainsAny(s, " \t\n{}") {
		return "", "", fmt.Errorf("-rate must be LIMIT/WINDOW (as 100/1s), got %q", s)
	}
	for _, c := range limit {
		if c < '0' || c > '9' {
			return "", "", fmt.Errorf("-rate must be LIMIT/WINDOW (as 100/1s), got %q", s)
		}
	}
	return limit, window, nil
}

// withRate returns the site with its many-key limiter at rate (limit and
// window replaced), or the site unchanged when rate is empty or the site is
// not a many-key one of ours (hot keys, the at-limit sites and the peer keep
// theirs).
func (s site) withRate(rate string) site {
	if rate == "" || s.Peer || s.Hot || s.Fill || len(s.Limiter) == 0 {
		return s
	}
	limit, window, err := parseRate(rate)
	if err != nil {
		return s
	}
	l := make([]string, len(s.Limiter))
	for i, line := range s.Limiter {
		switch {
		case strings.HasPrefix(line, "limit "):
			line = "limit " + limit
		case strings.HasPrefix(line, "window "):
			line = "window " + window
		}
		l[i] = line
	}
	s.Limiter = l
	return s
}
