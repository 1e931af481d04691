package slidingratelimit

// The `caddy ratelimit` command: the admin API, as an operator reads it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "ratelimit",
		Usage: "list|show|reset|top [--address <interface>] [--config <path> [--adapter <name>]] [--json]",
		Short: "Shows sliding_ratelimit limiters, keys and top offenders; resets keys",
		Long: `
Reads and resets the sliding_ratelimit limiters of a running Caddy through its
admin API, and prints tables (--json: the admin API's JSON as it is).

  caddy ratelimit list                                 the limiters
  caddy ratelimit show  --name <limiter> --key <key> [--region <region>]
                                                       what the key's next request would get
  caddy ratelimit reset --name <limiter> --key <key> [--region <region>]
                                                       reset the key, on every node sharing the store
  caddy ratelimit top   --name <limiter> [-n 10]       the keys this node denied most lately

--key is the identity as the limiter's key template resolves for the client
(the API key, the client IP...). The admin endpoint is --address if given,
else the admin address of the --config file (adapted with --adapter), else
Caddy's default, localhost:2019: as 'caddy stop' and 'caddy reload' find it.
`,
		CobraFunc: ratelimitCommand,
	})
}

// ratelimitCommand builds `caddy ratelimit` and its subcommands on cmd.
func ratelimitCommand(cmd *cobra.Command) {
	pf := cmd.PersistentFlags()
	pf.String("address", "", "The address of Caddy's admin endpoint, if not the one of --config or the default")
	pf.StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	pf.StringP("adapter", "a", "", "Name of the config adapter of --config")
	pf.Bool("json", false, "Print the admin API's JSON instead of tables")

	sub := func(use, short string, run func(caddycmd.Flags, io.Writer) error) *cobra.Command {
		c := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
		c.RunE = func(c *cobra.Command, args []string) error {
			return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
				if err := run(fl, c.OutOrStdout()); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				return caddy.ExitCodeSuccess, nil
			})(c, args)
		}
		cmd.AddCommand(c)
		return c
	}
	keyFlags := func(c *cobra.Command) {
		c.Flags().String("name", "", "The limiter's name (required)")
		c.Flags().StringP("key", "k", "", "The key, as the limiter's key template resolves for the client (required)")
		c.Flags().StringP("region", "r", "", "The region, for a limiter with one")
	}

	sub("list", "Lists the limiters", cmdList)
	show := sub("show --name <limiter> --key <key> [--region <region>]", "Shows what a key's next request would get (nothing consumed)", cmdShow)
	keyFlags(show)
	for _, p := range []string{"limit", "global-limit", "cost", "max-concurrent"} {
		show.Flags().String(p, "", "The client's "+strings.ReplaceAll(p, "-", "_")+", for a limiter whose "+strings.ReplaceAll(p, "-", "_")+" is a placeholder")
	}
	keyFlags(sub("reset --name <limiter> --key <key> [--region <region>]", "Resets a key: its windows, global ceiling and ban, on every node", cmdReset))
	top := sub("top --name <limiter> [-n 10]", "Lists the keys this node denied most (and saw near their limit most) lately", cmdTop)
	top.Flags().String("name", "", "The limiter's name (required)")
	top.Flags().IntP("count", "n", 10, "How many keys to list (1 to 1024)")
}

func cmdList(fl caddycmd.Flags, out io.Writer) error {
	body, err := adminCall(fl, http.MethodGet, "/sliding_ratelimit/")
	if err != nil || fl.Bool("json") {
		return printJSON(out, body, err)
	}
	var ls []limiterInfo
	if err := json.Unmarshal(body, &ls); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return writeLimiters(out, ls)
}

func cmdShow(fl caddycmd.Flags, out io.Writer) error {
	uri, err := keyURI(fl)
	if err != nil {
		return err
	}
	q := url.Values{}
	for _, p := range []string{"limit", "global-limit", "cost", "max-concurrent"} {
		if v := fl.String(p); v != "" {
			q.Set(strings.ReplaceAll(p, "-", "_"), v)
		}
	}
	if len(q) > 0 {
		uri += "&" + q.Encode()
	}
	body, err := adminCall(fl, http.MethodGet, uri)
	if err != nil {
		return showFlags(err)
	}
	if fl.Bool("json") {
		return printJSON(out, body, nil)
	}
	var u usageInfo
	if err := json.Unmarshal(body, &u); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return writeUsage(out, &u)
}

// missingValue is one value the admin API says a limiter's placeholders
// need: "limit ({tier_limit})", "cost ({http.vars.cost}, got 'x')".
var missingValue = regexp.MustCompile(`\b(limit|global_limit|cost|max_concurrent) \((\{.*?\})(, got '[^']*')?\)`)

// showFlags turns the admin API's list of the values a limiter's
// placeholders need, named as its query parameters, into the flags of
// show that give them: "--limit <n> (limit {tier_limit})", one value per
// placeholder, comma-separated when a flag needs several.
func showFlags(err error) error {
	head, list, ok := strings.Cut(err.Error(), "give the client's: ")
	if !ok {
		return err
	}
	var order []string
	templates := map[string][]string{}
	tail := missingValue.ReplaceAllString(list, "")
	for _, m := range missingValue.FindAllStringSubmatch(list, -1) {
		if templates[m[1]] == nil {
			order = append(order, m[1])
		}
		templates[m[1]] = append(templates[m[1]], m[2]+m[3])
	}
	if len(order) == 0 {
		return err
	}
	var flags []string
	for _, param := range order {
		ts := templates[param]
		flags = append(flags, fmt.Sprintf("--%s %s (%s %s)", strings.ReplaceAll(param, "_", "-"),
			strings.TrimSuffix(strings.Repeat("<n>,", len(ts)), ","), param, strings.Join(ts, ", ")))
	}
	if tail = strings.TrimLeft(tail, ", "); tail != "" {
		tail = " " + tail
	}
	return fmt.Errorf("%sgive the client's: %s%s", head, strings.Join(flags, ", "), tail)
}

func cmdReset(fl caddycmd.Flags, out io.Writer) error {
	uri, err := keyURI(fl)
	if err != nil {
		return err
	}
	body, err := adminCall(fl, http.MethodDelete, uri)
	if err != nil || fl.Bool("json") {
		return printJSON(out, body, err)
	}
	var r resetInfo
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return writeReset(out, &r)
}

func cmdTop(fl caddycmd.Flags, out io.Writer) error {
	name := fl.String("name")
	if name == "" {
		return errors.New("--name is required: the limiter's name ('caddy ratelimit list' lists them)")
	}
	uri := "/sliding_ratelimit/" + url.PathEscape(name) + "/top?n=" + strconv.Itoa(fl.Int("count"))
	body, err := adminCall(fl, http.MethodGet, uri)
	if err != nil || fl.Bool("json") {
		return printJSON(out, body, err)
	}
	var t topInfo
	if err := json.Unmarshal(body, &t); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return writeTop(out, &t)
}

// keyURI is the admin path of --name's --key in --region.
func keyURI(fl caddycmd.Flags) (string, error) {
	name, key := fl.String("name"), fl.String("key")
	if name == "" {
		return "", errors.New("--name is required: the limiter's name ('caddy ratelimit list' lists them)")
	}
	if !fl.Changed("key") {
		return "", errors.New("--key is required: the key as the limiter's key template resolves for the client")
	}
	q := url.Values{"key": {key}}
	if fl.Changed("region") {
		q.Set("region", fl.String("region"))
	}
	return "/sliding_ratelimit/" + url.PathEscape(name) + "?" + q.Encode(), nil
}

// adminCall sends one request to the admin endpoint that --address,
// --config or the default name, and returns the answer's body; the admin
// API's own message when it refuses.
func adminCall(fl caddycmd.Flags, method, uri string) ([]byte, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return nil, fmt.Errorf("couldn't determine the admin API address: %v", err)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, nil, nil)
	if err != nil {
		return nil, adminError(addr, err)
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, 16<<20))
}

// refused matches the error of caddycmd.AdminAPIRequest for an answer
// of 400 or more.
var refused = regexp.MustCompile(`(?s)^caddy responded with error: HTTP (\d+): (.*)$`)

// adminError says why the admin API did not answer: its own message, or
// that Caddy is not there.
func adminError(addr string, err error) error {
	m := refused.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("cannot reach Caddy's admin API at %s: is Caddy running? (--address, or --config to read the address from the config): %v", addr, err)
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(m[2]), &e) == nil && e.Error != "" {
		return fmt.Errorf("%s (HTTP %s from %s)", e.Error, m[1], addr)
	}
	return fmt.Errorf("HTTP %s from %s: %s", m[1], addr, strings.TrimSpace(m[2]))
}

// printJSON writes the admin API's answer, indented.
func printJSON(out io.Writer, body []byte, err error) error {
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if json.Indent(&buf, bytes.TrimSpace(body), "", "  ") != nil {
		_, err := out.Write(body)
		return err
	}
	buf.WriteByte('\n')
	_, err = buf.WriteTo(out)
	return err
}

func newTable(out io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(out, 0, 0, 2, ' ', 0) }

// writeLimiters prints the limiters, one per line.
func writeLimiters(out io.Writer, ls []limiterInfo) error {
	if len(ls) == 0 {
		_, err := fmt.Fprintln(out, "no sliding_ratelimit limiters in the running config")
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "NAME\tALGORITHM\tLIMITS\tKEY\tREGION\tSTORE\tFAIL\tNOTES")
	for _, l := range ls {
		var limits, notes []string
		for _, w := range l.Windows {
			s := string(w.Limit) + "/" + w.Window
			if w.Global {
				s = "global " + s
			}
			limits = append(limits, s)
		}
		if l.DryRun {
			notes = append(notes, "dry run")
		}
		if b := l.Ban; b != nil {
			notes = append(notes, fmt.Sprintf("ban %s after %d within %s", shortDuration(time.Duration(b.For)), b.After, shortDuration(time.Duration(b.Within))))
		}
		if l.Datacenter != "" {
			notes = append(notes, "global ceiling across data centres, this one "+l.Datacenter)
		}
		if l.Instances > 1 {
			notes = append(notes, fmt.Sprintf("%d instances", l.Instances))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Name, l.Algorithm, orDash(strings.Join(limits, ", ")),
			l.Key, orDash(l.Region), l.Store, l.Fail, orDash(strings.Join(notes, "; ")))
	}
	return tw.Flush()
}

// writeUsage prints what a key's next request would get, then its windows.
func writeUsage(out io.Writer, u *usageInfo) error {
	tw := newTable(out)
	fmt.Fprintf(tw, "limiter\t%s\n", u.Limiter)
	fmt.Fprintf(tw, "key\t%s (key_hash %s)\n", u.Key, u.KeyHash)
	if u.Region != "" {
		fmt.Fprintf(tw, "region\t%s\n", u.Region)
	} else if u.RegionTemplate != "" {
		fmt.Fprintf(tw, "region\tnone given: the requests whose region (%s) is empty; --region <region> shows one region\n", u.RegionTemplate)
	}
	next := "allowed"
	if !u.Allowed {
		next = fmt.Sprintf("denied (%s), retry after %s", u.Outcome, seconds(u.RetryAfter))
	}
	fmt.Fprintf(tw, "next request\t%s\n", next)
	if u.Banned {
		fmt.Fprintf(tw, "banned\t%s left\n", seconds(u.BanLeft))
	}
	if u.InFlight != nil {
		fmt.Fprintf(tw, "in flight\t%d\n", *u.InFlight)
	}
	if g := u.Global; g != nil {
		standing := "on the ledger"
		if g.Static {
			standing = "on its static share (cut off from the ledger)"
		}
		fmt.Fprintf(tw, "datacenter\t%s (this node), %s; %d data centres known; ledger round trip %s\n",
			g.Datacenter, standing, g.Datacenters, time.Duration(g.RoundTripMS*float64(time.Millisecond)).Round(10*time.Microsecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(u.Windows) > 0 {
		fmt.Fprintln(out)
		tw = newTable(out)
		fmt.Fprintln(tw, "WINDOW\tCOUNT\tLIMIT\tREMAINING\tRESET IN")
		for _, w := range u.Windows {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", w.Policy, w.Count, w.Limit, w.Remaining, seconds(w.Reset))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if u.Global != nil {
		return writeShares(out, u.Global)
	}
	return nil
}

// writeShares prints each data centre's share of the key's global
// ceiling, as the ledger sees it.
func writeShares(out io.Writer, g *globalInfo) error {
	fmt.Fprintln(out, "\nShares of the global ceiling, as the ledger sees them")
	switch {
	case g.SharesError != "":
		_, err := fmt.Fprintf(out, "  the ledger did not answer: %s\n", g.SharesError)
		return err
	case len(g.Shares) == 0:
		_, err := fmt.Fprintln(out, "  none: no data centre holds or counted a share of this key")
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "DATACENTER\tADMITTED\tHELD\tCOUNTED\tDEMAND")
	for _, s := range g.Shares {
		name := s.Datacenter
		if name == g.Datacenter {
			name += " (this node)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d/s\n", name, s.Admitted, s.Held, s.Counted, s.Rate)
	}
	fmt.Fprintf(tw, "in all\t%d\n", g.Admitted)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(out, "  (admitted: in the longest global window, another data centre's as it last told the ledger;\n"+
		"  held: granted and not ended; counted: what the ledger counts, unspent units until they come back)")
	return err
}

// writeReset prints what a reset did: the key, the windows it cleared
// (the global ceiling's named as such), the ban.
func writeReset(out io.Writer, r *resetInfo) error {
	where := ""
	if r.Region != "" {
		where = " in region " + r.Region
	} else if r.RegionTemplate != "" {
		where = " in no region (the requests whose region is empty; --region <region> resets one region)"
	}
	var cleared []string
	for _, w := range r.Windows {
		s := w.Policy + " " + string(w.Limit) + "/" + w.Window
		if w.Global {
			s = "global ceiling " + s + " (across regions)"
		}
		cleared = append(cleared, s)
	}
	if r.Ban {
		cleared = append(cleared, "ban")
	}
	if r.Ledger {
		s := "the ledger's grants (every data centre's share)"
		if r.OtherDatacentersTold > 0 {
			s += fmt.Sprintf("; other data centres told to drop theirs: %d", r.OtherDatacentersTold)
		}
		cleared = append(cleared, s)
	}
	others := "no (the notice could not be published: other nodes may deny the key from their deny caches until its retry time)"
	if r.OtherNodesNotified {
		others = "yes"
	}
	_, err := fmt.Fprintf(out, "reset: limiter %s, key %s (key_hash %s)%s\ncleared: %s\nother nodes notified: %s\n",
		r.Limiter, r.Key, r.KeyHash, where, orDash(strings.Join(cleared, "; ")), others)
	switch {
	case err != nil || r.LedgerError == "":
	case r.Ledger:
		_, err = fmt.Fprintf(out, "ledger: reset on its primary, not acknowledged by its replicas (%s): a failover may lose it; reset again after one\n", r.LedgerError)
	default:
		_, err = fmt.Fprintf(out, "ledger: not reset, it did not answer (%s): the key's count in the global ceiling stays; reset again\n", r.LedgerError)
	}
	return err
}

// writeTop prints the top offenders: the most denied keys, then the keys
// most often near their limit.
func writeTop(out io.Writer, t *topInfo) error {
	keys := "keys are the first 12 hex digits of their SHA-256 (log_key shows them)"
	if t.KeysShown == "raw" {
		keys = "keys as they are (log_key)"
	}
	fmt.Fprintf(out, "limiter %s on this node, %s to %s (%s)\n%s; a count may be ERROR above the truth\n", t.Limiter,
		t.Since.Format("2006-01-02 15:04:05"), t.At.Format("15:04:05 MST"), shortDuration(t.At.Sub(t.Since).Truncate(time.Second)), keys)
	key := func(o *offender) string {
		if o.Key != "" {
			return o.Key
		}
		return o.KeyHash
	}
	ago := func(o *offender) string {
		if d := t.At.Sub(o.LastSeen); d >= time.Second {
			return shortDuration(d.Truncate(time.Second)) + " ago"
		}
		return "now"
	}
	fmt.Fprintln(out, "\nMost denied")
	if len(t.Denied) == 0 {
		fmt.Fprintln(out, "  none")
	} else {
		tw := newTable(out)
		fmt.Fprintln(tw, "KEY\tREGION\tDENIALS\tERROR\tNEAR LIMIT\tRETRY-AFTER\tLAST SEEN")
		for i := range t.Denied {
			o := &t.Denied[i]
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", key(o), orDash(o.Region), o.Denials, o.DenialsError, o.NearLimit, seconds(o.RetryAfter), ago(o))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "\nMost often near their limit (warn_at crossed)")
	if len(t.NearLimit) == 0 {
		_, err := fmt.Fprintln(out, "  none")
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "KEY\tREGION\tNEAR LIMIT\tERROR\tDENIALS\tLAST SEEN")
	for i := range t.NearLimit {
		o := &t.NearLimit[i]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", key(o), orDash(o.Region), o.NearLimit, o.NearLimitError, o.Denials, ago(o))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// seconds is n seconds, as shortDuration writes them; "-" for none.
func seconds(n int64) string {
	if n <= 0 {
		return "-"
	}
	return shortDuration(time.Duration(n) * time.Second)
}

// shortDuration is d without its zero units: 1h, 1h30m, 90s stays 1m30s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
