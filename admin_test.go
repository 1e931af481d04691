package slidingratelimit

// The admin API: a key's usage, its reset, the limiters.

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// adminDelete resets key in region through the admin API, as an operator
// would.
func adminDelete(t *testing.T, name, key, region string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodDelete, "/sliding_ratelimit/"+name+"?key="+key+"&region="+region, nil)
	if err := (&AdminAPI{}).serve(w, r); err != nil || w.Code != http.StatusOK {
		t.Fatalf("DELETE: %v (status %d, %s)", err, w.Code, w.Body)
	}
}

// adminGet asks the admin API what key's next request would get.
func adminGet(t *testing.T, name, query string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/sliding_ratelimit/"+name+"?"+query, nil)
	if err := (&AdminAPI{}).serve(w, r); err != nil {
		var ae caddy.APIError
		if errorsAs(err, &ae) {
			return ae.HTTPStatus, ae.Err.Error()
		}
		t.Fatal(err)
	}
	return w.Code, w.Body.String()
}

// TestAdminAPI: GET shows count 5 after 5 requests; DELETE resets; the next
// 5 are admitted.
func TestAdminAPI(t *testing.T) {
	name := uniqueName()
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	sliding_ratelimit {
		name   `+name+`
		key    {http.request.header.X-API-Key}
		region {http.request.header.X-Region}
		limit  5
		window 1m
	}
	respond "ok"
}
`, "caddyfile")
	hdr := map[string]string{"X-API-Key": "cust-42", "X-Region": "us"}
	admitted := func(n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			if get(t, tester, "http://localhost:9080/", hdr).StatusCode == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := admitted(6); got != 5 {
		t.Fatalf("%d admitted of 6, want 5", got)
	}
	url := "http://localhost:2999/sliding_ratelimit/" + name + "?key=cust-42&region=us"
	var u usageInfo
	resp := get(t, tester, url, nil)
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	if w := u.Windows[0]; w.Count != 5 || w.Remaining != 0 || w.Limit != 5 || u.RetryAfter < 1 || u.Allowed {
		t.Fatalf("usage %+v, want count 5, remaining 0, a retry time", u)
	}
	// GET consumed nothing; a trailing slash after the name is the same path.
	slashed := "http://localhost:2999/sliding_ratelimit/" + name + "/?key=cust-42&region=us"
	for _, u2 := range []string{url, slashed} {
		resp = get(t, tester, u2, nil)
		u = usageInfo{}
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || resp.StatusCode != http.StatusOK || len(u.Windows) != 1 {
			t.Fatalf("GET %s: %d %v %+v", u2, resp.StatusCode, err, u)
		}
		if u.Windows[0].Count != 5 || u.Limiter != name {
			t.Fatalf("GET %s: %+v, want limiter %s with count 5", u2, u, name)
		}
	}

	req, _ := http.NewRequest(http.MethodDelete, slashed, nil)
	req.Header.Set("Origin", "http://localhost:2999")
	dresp, err := tester.Client.Do(req)
	if err != nil || dresp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %v %v", dresp.Status, err)
	}
	dresp.Body.Close()
	if got := admitted(6); got != 5 {
		t.Fatalf("after a DELETE with a trailing slash: %d admitted of 6, want 5", got)
	}

	resp = get(t, tester, "http://localhost:2999/sliding_ratelimit/", nil)
	var list []limiterInfo
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		found = found || (l.Name == name && len(l.Windows) == 1 && l.Windows[0].Limit == "5" && l.Store == "memory")
	}
	if !found {
		t.Errorf("limiter list %+v does not show %s", list, name)
	}
	if resp := get(t, tester, "http://localhost:2999/sliding_ratelimit/nope?key=x", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown limiter: status %d, want 404", resp.StatusCode)
	}
}

// TestAdminGetTellsTheTruth: a limiter whose limit comes from a placeholder
// cannot guess a client's limit: the admin GET says which value it needs,
// and with it answers what the client's next request would get.
func TestAdminGetTellsTheTruth(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "{http.request.header.X-Tier}", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	for i := 0; i < 3; i++ {
		serve(t, h, map[string]string{"X-API-Key": "K", "X-Tier": "5"})
	}
	code, body := adminGet(t, h.Name, "key=K")
	if code != http.StatusBadRequest || !strings.Contains(body, "limit ({http.request.header.X-Tier})") {
		t.Fatalf("GET without the client's limit: %d %s, want 400 naming the placeholder", code, body)
	}
	code, body = adminGet(t, h.Name, "key=K&limit=5")
	var u struct {
		Allowed bool `json:"allowed"`
		Windows []struct {
			Count, Limit, Remaining int64
		} `json:"windows"`
	}
	if err := json.Unmarshal([]byte(body), &u); err != nil || code != http.StatusOK || len(u.Windows) != 1 {
		t.Fatalf("GET with limit=5: %d %s (%v)", code, body, err)
	}
	if w := u.Windows[0]; !u.Allowed || w.Count != 3 || w.Limit != 5 || w.Remaining != 2 {
		t.Errorf("GET with limit=5: %+v, want allowed with 3 of 5 used, 2 left", u)
	}
}

// TestResetClearsDenialsOfEveryRegion: the global ceiling denies K in gb,
// and the denial is cached. An operator resets K in us, which clears K's
// global ceiling: gb must get through at once, not after the cached
// retry time.
func TestResetClearsDenialsOfEveryRegion(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "5", GlobalLimit: "7", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(2 * time.Second)}}
	provision(t, h, newTestClock())
	us := map[string]string{"X-API-Key": "K", "X-Region": "us"}
	gb := map[string]string{"X-API-Key": "K", "X-Region": "gb"}
	for i := 0; i < 5; i++ {
		serve(t, h, us)
	}
	for i := 0; i < 2; i++ {
		serve(t, h, gb)
	}
	for i := 0; i < 3; i++ { // the global ceiling: denied, then from the cache
		if w := serve(t, h, gb); w.Code != http.StatusTooManyRequests {
			t.Fatalf("gb over the global ceiling: %d", w.Code)
		}
	}
	adminDelete(t, h.Name, "K", "us")
	if w := serve(t, h, gb); w.Code != http.StatusOK {
		t.Fatalf("gb after K's reset: %d %s (a cached denial outlived the reset)", w.Code, w.Body)
	}
}

// statusOf is the HTTP status of a handler error (0 for none).
func statusOf(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// adminAnswer sends one request to the admin API and decodes its JSON
// answer into v.
func adminAnswer(t *testing.T, method, uri string, v any) {
	t.Helper()
	w := httptest.NewRecorder()
	if err := (&AdminAPI{}).serve(w, httptest.NewRequest(method, uri, nil)); err != nil || w.Code != http.StatusOK {
		t.Fatalf("%s %s: %v (status %d, %s)", method, uri, err, w.Code, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("%s %s: %v in %s", method, uri, err, w.Body)
	}
}

// TestAdminListShowsAPlaceholderAsItsTemplate: a limit a placeholder gives
// per request is listed, by the admin GET and `caddy ratelimit list`, as
// its template beside the static windows, not left out.
func TestAdminListShowsAPlaceholderAsItsTemplate(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "{http.vars.tier}", Window: caddy.Duration(time.Minute),
		Limits: []LimitConfig{{Limit: "1000", Period: "day"}}}
	provision(t, h, newTestClock())
	var ls []limiterInfo
	adminAnswer(t, http.MethodGet, "/sliding_ratelimit/", &ls)
	var mine []limiterInfo
	for _, l := range ls {
		if l.Name == h.Name {
			mine = append(mine, l)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("the listing %+v does not hold %s once", ls, h.Name)
	}
	var out strings.Builder
	if err := writeLimiters(&out, mine); err != nil {
		t.Fatal(err)
	}
	if want := "{http.vars.tier}/1m, 1000/day"; !strings.Contains(out.String(), want) {
		t.Errorf("caddy ratelimit list:\n%s\nwant the limits %q", out.String(), want)
	}
}

// TestAdminSaysWhichRegionAndWhatItReset: on a limiter with regions, a key
// shown with no region says which bucket it shows (not a bare "allowed"),
// and a reset says what it cleared: the region's window, the global
// ceiling across regions, the ban.
func TestAdminSaysWhichRegionAndWhatItReset(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "5", GlobalLimit: "8", Window: caddy.Duration(time.Minute),
		Ban: &BanConfig{For: caddy.Duration(time.Hour), After: 3, Within: caddy.Duration(time.Minute)}}
	provision(t, h, newTestClock())
	serve(t, h, map[string]string{"X-API-Key": "K", "X-Region": "us"})

	var u usageInfo
	adminAnswer(t, http.MethodGet, "/sliding_ratelimit/"+h.Name+"?key=K", &u)
	var out strings.Builder
	if err := writeUsage(&out, &u); err != nil {
		t.Fatal(err)
	}
	if want := "region        none given: the requests whose region ({http.request.header.X-Region}) is empty; --region <region> shows one region\n"; !strings.Contains(out.String(), want) {
		t.Errorf("caddy ratelimit show without --region:\n%s\nwant the line %q", out.String(), want)
	}

	for _, c := range []struct{ query, want string }{
		{"key=K&region=us", "reset: limiter " + h.Name + ", key K (key_hash " + keyHash("K") + ") in region us\n" +
			"cleared: " + h.Name + " 5/1m; global ceiling " + h.Name + "-global 8/1m (across regions); ban\n"},
		{"key=K", "reset: limiter " + h.Name + ", key K (key_hash " + keyHash("K") + ") in no region (the requests whose region is empty; --region <region> resets one region)\n"},
	} {
		var r resetInfo
		adminAnswer(t, http.MethodDelete, "/sliding_ratelimit/"+h.Name+"?"+c.query, &r)
		out.Reset()
		if err := writeReset(&out, &r); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), c.want) {
			t.Errorf("caddy ratelimit reset (%s):\n%s\nwant it to start with:\n%s", c.query, out.String(), c.want)
		}
	}
}
