package limiter

import "github.com/sliding-ratelimit/sliding_ratelimit/limiter/dc"

// SetGlobalHook sets the function a limiter's global ceiling calls at each
// stage of a renewal ("granted": the ledger granted, the share does not
// hold it yet; "deposited": the share was written), for the fault tests: a
// node killed there, a reload during a renewal.
func SetGlobalHook(l *Limiter, hook func(stage string)) { l.g.(*dc.Ceiling).SetHook(hook) }

// GlobalClosing reports whether l's global ceiling began to close (its
// renewals still landing).
func GlobalClosing(l *Limiter) bool { return l.g.(*dc.Ceiling).Closing() }

// PendingDrops is the shares l's global ceiling keeps to drop again (a
// reset's drop that failed).
func PendingDrops(l *Limiter) int { return l.g.(*dc.Ceiling).PendingDrops() }
