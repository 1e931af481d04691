package limiter

// What a data centre knows of an identity's global ceiling, for what the
// decisions and an operator are shown (headers, the admin GET): the
// ledger's counts, as the share keeps them, and what was admitted.

// shareCounts puts the ledger's counts (in the policy's order of the
// global windows) in the share part's order; nil when the ledger gave
// none for every window.
func (g *global) shareCounts(counts []int64) []int64 {
	nb := len(g.l.p.Windows)
	if len(counts) != len(g.l.p.GlobalWindows) {
		return nil
	}
	var out []int64
	for _, ps := range g.l.parts {
		if ps.kind != KindShare {
			continue
		}
		for _, i := range ps.windows {
			out = append(out, counts[i-nb])
		}
	}
	return out
}
