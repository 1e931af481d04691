package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
)

// KeyFunc gives the identity whose budget a request spends. Any value is
// safe: the engine keeps a key as it is only when it is 1 to 64 printable
// bytes without '{', '}', ':' or '*', and hashes anything else, so no
// header can reach another key or grow one.
type KeyFunc func(*http.Request) string

// maxForwardedHops bounds the X-Forwarded-For entries ClientIP reads.
const maxForwardedHops = 32

// ClientIP keys by the client's IP address: the connection's, or, when
// the connection comes from a trusted proxy (Config.TrustedProxies, or
// prefixes here), the right-most address of X-Forwarded-For that is not a
// trusted proxy (a client can prepend anything; only what the trusted
// proxies appended counts). At most the last 32 entries are read.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	prefixes := make([]netip.Prefix, len(trusted))
	for i, p := range trusted {
		prefixes[i] = p.Masked()
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) string {
		addr, ok := remoteAddr(r.RemoteAddr)
		if !ok {
			return ""
		}
		if !isTrusted(addr) {
			return addr.String()
		}
		hops := forwarded(r.Header.Values("X-Forwarded-For"))
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // what no trusted proxy wrote: the last trusted hop is the client
			}
			addr = a.Unmap()
			if !isTrusted(addr) {
				break
			}
		}
		return addr.String()
	}
}

// ParsePrefixes reads trusted proxies: addresses ("10.0.0.1") or CIDR
// prefixes ("10.0.0.0/8"); field names them in the error.
func ParsePrefixes(field string, list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, t := range list {
		p, err := netip.ParsePrefix(t)
		if err != nil {
			a, aerr := netip.ParseAddr(t)
			if aerr != nil {
				return nil, configErr(fmt.Sprintf("%s[%d]", field, i), "'%s' is neither an IP address nor a CIDR prefix (10.0.0.0/8)", t)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return out, nil
}

// forwarded lists the last maxForwardedHops entries of X-Forwarded-For's
// values.
func forwarded(vals []string) []string {
	var hops []string
	for i := len(vals) - 1; i >= 0 && len(hops) < maxForwardedHops; i-- {
		parts := strings.Split(vals[i], ",")
		for j := len(parts) - 1; j >= 0 && len(hops) < maxForwardedHops; j-- {
			hops = append(hops, parts[j])
		}
	}
	// hops is right-most first: reverse it.
	for i, j := 0, len(hops)-1; i < j; i, j = i+1, j-1 {
		hops[i], hops[j] = hops[j], hops[i]
	}
	return hops
}

// remoteAddr is the address of a RemoteAddr (host:port, or a bare host).
func remoteAddr(ra string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(ra)
	if err != nil {
		host = ra
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// Header keys by a request header (an API key): its values joined by ","
// as Caddy's {http.request.header.*} gives them; "" when absent (every
// such request shares one budget, counted in empty_keys_total).
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return reply.HeaderKey(r.Header, name) }
}
