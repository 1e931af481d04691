package limiter

// What a data centre knows of an identity's global ceiling, for what the
// decisions and an operator are shown (headers, the admin GET): the
// ledger's counts, as the share keeps them, and what was admitted.

import "context"

// GlobalUse is what was admitted under an identity's global ceiling, in
// its longest window, per data centre and in all.
type GlobalUse struct {
	// Shares are the ledger's, each data centre's Admitted as it last told
	// the ledger, but this data centre's exact: what the ledger counts of
	// its grants less what its share holds of them unspent.
	Shares []LedgerShare
	// Admitted is their sum; Unspent what this data centre's share holds
	// of its grants, not used; Counted what the ledger counts of every
	// data centre's grants.
	Admitted, Unspent, Counted int64
}

// Remaining is what this data centre's requests can rely on now of a
// limit (the longest window's): the ledger's room and its unspent share.
func (u *GlobalUse) Remaining(limit int64) int64 {
	return max(min(limit-u.Counted+u.Unspent, limit), 0)
}

// GlobalUse reads the ledger's shares of in's identity and this data
// centre's share (ok false without global_redis).
func (l *Limiter) GlobalUse(ctx context.Context, in *Input) (GlobalUse, bool, error) {
	if l.g == nil {
		return GlobalUse{}, false, nil
	}
	shares, err := l.Shares(ctx, in.Identity)
	if err != nil {
		return GlobalUse{}, true, err
	}
	var u GlobalUse
	unspent, verr := l.g.Unspent(ctx, dcRequest(in, nil))
	u.Unspent = unspent
	for _, s := range shares {
		if s.Datacenter == l.g.Datacenter() && verr == nil {
			// (The data centre's store not answering, as it last told
			// the ledger.)
			s.Admitted = max(s.Counted-u.Unspent, 0)
		}
		u.Admitted += s.Admitted
		u.Counted += s.Counted
		u.Shares = append(u.Shares, s)
	}
	return u, true, nil
}

// Shares returns each data centre's share of identity's ceiling, as the
// ledger sees it (nil without global_redis).
func (l *Limiter) Shares(ctx context.Context, identity string) ([]LedgerShare, error) {
	if l.g == nil {
		return nil, nil
	}
	return l.g.Shares(ctx, identity)
}

// ResetGlobal forgets identity's grants in the ledger (an operator's
// reset through this node; false without global_redis) and has every other
// data centre that held a share of it drop that share; this data centre's
// is Reset's. It returns how many data centres were told.
func (l *Limiter) ResetGlobal(ctx context.Context, identity string) (int64, bool, error) {
	if l.g == nil {
		return 0, false, nil
	}
	n, err := l.g.Reset(ctx, identity)
	return n, true, err
}

// GlobalState returns the node's view (ok false without global_redis).
func (l *Limiter) GlobalState() (GlobalState, bool) {
	if l.g == nil {
		return GlobalState{}, false
	}
	return l.g.State(), true
}
