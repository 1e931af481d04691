// Package dc is the data-centre code of a global ceiling kept in a ledger
// every data centre shares (global_redis): the ledger's client (Ledger),
// the shares of identities' ceilings each data centre keeps in its own
// store (ShareStore), their renewals, recalls, the membership's beats and
// the static share (Ceiling). The engine (package limiter) calls it
// through one interface, and decides; this package imports nothing of the
// engine: what it needs of it comes in a Host.
package dc
