package slidingratelimit

import (
	"strings"
	"testing"
)

// TestAuthPlaceholderBeforeAuthentication: a limiter keyed on the user
// ({http.auth.user.id}) beside basic_auth runs first (its directive order):
// the config is refused with the fix. Run after the authentication (a
// route block, the order option), it loads; so does one that reads no
// {http.auth.*}, and one whose authentication is in another site.
func TestAuthPlaceholderBeforeAuthentication(t *testing.T) {
	t.Parallel()
	const hash = "$2a$14$phBdYLJKT.I3GBTOGVNaBeuMuFgHacAhSO9cUmMrDtTmSa3p.K0ke"
	auth := "basic_auth {\n\t\tbob " + hash + "\n\t}\n\t"
	limit := func(name, key string) string {
		return "sliding_ratelimit {\n\t\tname " + name + "\n\t\tkey " + key + "\n\t\tlimit 5\n\t\twindow 1m\n\t}\n\t"
	}
	site := func(global, body string) string {
		return "{\n\tadmin off\n" + global + "}\n:8080 {\n\t" + body + "respond ok\n}\n"
	}
	fix := "Run the authentication first: put both in a route block (route { basic_auth ... then sliding_ratelimit ... }), or set the global option order sliding_ratelimit after basic_auth"
	for _, c := range []struct {
		name, src, want string
	}{
		{"key on the user beside basic_auth", site("", auth+limit("peruser", "{http.auth.user.id}")),
			"sliding_ratelimit: limiter peruser: key {http.auth.user.id}: {http.auth.user.id} is set by the authentication handler (basic_auth, or a plugin's provider such as JWT), which runs after this limiter in its route: " +
				"it is empty here, so every user would share one budget and a request without credentials would get 429, not 401. " + fix},
		{"key on the user, basic_auth inside a later handle", site("", limit("handled", "{http.auth.user.id}")+"handle {\n\t\t"+strings.ReplaceAll(auth, "\n\t", "\n\t\t")+"}\n\t"),
			"sliding_ratelimit: limiter handled: key {http.auth.user.id}: {http.auth.user.id} is set by the authentication handler"},
		{"a cost from the user's metadata", site("", auth+strings.Replace(limit("costly", "{remote_host}"), "limit 5", "limit 5\n\t\tcost {http.auth.user.cost}", 1)),
			"sliding_ratelimit: limiter costly: cost {http.auth.user.cost}: {http.auth.user.cost} is set by the authentication handler"},
		{"in a route, after basic_auth", site("", "route {\n\t\t"+strings.ReplaceAll(auth+limit("routed", "{http.auth.user.id}"), "\n\t", "\n\t\t")+"}\n\t"), ""},
		{"with the order option", site("\torder sliding_ratelimit after basic_auth\n", auth+limit("ordered", "{http.auth.user.id}")), ""},
		{"no auth placeholder", site("", auth+limit("perip", "{remote_host}")), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := loadCaddyfile(t, c.src)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused:\n%s\n%v", c.src, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasSuffix(err.Error(), fix)):
				t.Fatalf("loading gives %v\nwant an error ending %q\n%s", err, c.want, c.src)
			}
		})
	}
}
