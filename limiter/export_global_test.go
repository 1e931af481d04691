package limiter

// SetGlobalHook sets the function a limiter's global ceiling calls at each
// stage of a renewal ("granted": the ledger granted, the share does not
// hold it yet), for the fault tests: a node killed there.
func SetGlobalHook(l *Limiter, hook func(stage string)) { l.g.hook.Store(&hook) }
