package slidingratelimit

import (
	"cmp"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeCommands returns the two commands at the top of README.md: the one
// that runs it and the one that tests it.
func readmeCommands(t *testing.T) (run, test string) {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```\n(.*?)```").FindSubmatch(b)
	if block == nil {
		t.Fatal("README.md has no code block")
	}
	for _, line := range strings.Split(string(block[1]), "\n") {
		cmd, comment, _ := strings.Cut(line, "#")
		cmd = strings.TrimSpace(cmd)
		switch {
		case strings.Contains(comment, "run it"):
			run = cmd
		case strings.Contains(comment, "test it"):
			test = cmd
		}
	}
	if run == "" || test == "" {
		t.Fatalf("README's first code block must hold a '# run it' and a '# test it' command:\n%s", block[1])
	}
	return run, test
}

// TestReadmeTestCommand: CI runs exactly the README's test command, and the
// Makefile target behind it runs every package's tests.
func TestReadmeTestCommand(t *testing.T) {
	_, test := readmeCommands(t)
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(test) + `$`).Match(ci) {
		t.Errorf(".ci/run does not run the README's test command %q", test)
	}
	if test == "make test" {
		mk, err := os.ReadFile("Makefile")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^test:[^\n]*\n(?:\t.*\n)*?\t.*\$\(GO\) test [^\n]*\./\.\.\.`).Match(mk) {
			t.Errorf("Makefile's test target does not run go test ./...")
		}
	}
}

// TestReadmeRunCommand runs the README's run command as written: Caddy must
// serve with no Redis and limit requests (5 admitted, then 429). It serves
// on Caddy's admin port 2019 and the example's 8080; beside another Caddy,
// RUN_ADMIN_PORT and RUN_PORT move them (a copy of the example with the
// other ports), as make first-hour ADMIN_PORT=... PORT=... does.
func TestReadmeRunCommand(t *testing.T) {
	run, _ := readmeCommands(t)
	args := strings.Fields(run)
	admin, port := cmp.Or(os.Getenv("RUN_ADMIN_PORT"), "2019"), cmp.Or(os.Getenv("RUN_PORT"), "8080")
	cmd := exec.Command(args[0], args[1:]...)
	if admin != "2019" || port != "8080" {
		src := strings.Replace(readFile(t, "examples/Caddyfile"), "\n:8080 {", "\n:"+port+" {", 1)
		src = strings.Replace(src, "\tadmin localhost:2019\n", "\tadmin localhost:"+admin+"\n", 1)
		moved := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(moved, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd.Args = slices.Replace(slices.Clone(cmd.Args), slices.Index(cmd.Args, "examples/Caddyfile"), slices.Index(cmd.Args, "examples/Caddyfile")+1, moved)
	}
	// Another process on either port would answer in this Caddy's place
	// (seen: another checkout's test on 8080, every answer a 429): say so.
	for _, p := range []string{admin, port} {
		ln, err := net.Listen("tcp", "localhost:"+p)
		if err != nil {
			t.Fatalf("port %s is taken by another process (%v): the README's run command serves there; stop it, or move the test with RUN_ADMIN_PORT and RUN_PORT", p, err)
		}
		ln.Close()
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", run, err)
	}
	t.Cleanup(func() {
		// Interrupt first, as a user would: go run waits for Caddy to stop
		// and removes its build directory (a SIGKILL would leave it in the
		// temp directory). Kill what has not stopped after a while.
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	client := &http.Client{Timeout: 2 * time.Second}
	// go run compiles Caddy first: minutes on a fresh machine (README,
	// Measured times), so the bound is only there to end a hang.
	deadline := time.Now().Add(10 * time.Minute)
	for {
		resp, err := client.Get("http://localhost:" + admin + "/config/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q did not start serving:\n%s", run, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	codes := make([]int, 6)
	for i := range codes {
		resp, err := client.Get("http://localhost:" + port + "/")
		if err != nil {
			t.Fatalf("request %d: %v\n%s", i+1, err, out.String())
		}
		resp.Body.Close()
		codes[i] = resp.StatusCode
	}
	want := []int{200, 200, 200, 200, 200, 429}
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("statuses %v, want %v", codes, want)
		}
	}
}

// TestDocsACL: the ACL line in docs/redis.md grants every command the
// scripts run (the same list TestACL proves sufficient on a real Redis).
func TestDocsACL(t *testing.T) {
	line := regexp.MustCompile(`(?m)^\s*ACL SETUSER ratelimit .*$`).FindString(readFile(t, "docs/redis.md"))
	if line == "" {
		t.Fatal("docs/redis.md has no ACL SETUSER ratelimit line")
	}
	granted := map[string]bool{}
	for _, f := range strings.Fields(line) {
		granted[f] = true
	}
	for _, c := range limiterACLCommands(t) {
		if !granted[c] {
			t.Errorf("docs/redis.md's ACL line lacks %s, which the limiter needs", c)
		}
	}
	line = regexp.MustCompile(`(?m)^\s*ACL SETUSER ledger .*$`).FindString(readFile(t, "docs/redis.md"))
	if line == "" {
		t.Fatal("docs/redis.md has no ACL SETUSER ledger line (global_redis)")
	}
	granted = map[string]bool{}
	for _, f := range strings.Fields(line) {
		granted[f] = true
	}
	for _, c := range ledgerACLCommands(t) {
		if !granted[c] {
			t.Errorf("docs/redis.md's ledger ACL line lacks %s, which the ledger's script needs", c)
		}
	}
}

// syntaxFromCode returns the Syntax block of UnmarshalCaddyfile's doc
// comment, one normalised line per entry.
func syntaxFromCode(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("caddyfile.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)Syntax:\n//\n(.*?)\n//\n`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no Syntax block in caddyfile.go")
	}
	var lines []string
	for _, l := range strings.Split(string(m[1]), "\n") {
		lines = append(lines, strings.Join(strings.Fields(strings.TrimPrefix(l, "//")), " "))
	}
	return lines
}

// parsedSubdirectives lists the names the parser's `switch sub` statements
// accept (value switches are not subdirectives).
func parsedSubdirectives(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("caddyfile.go")
	if err != nil {
		t.Fatal(err)
	}
	var subs []string
	seen := map[string]bool{}
	var open []string // indents of the enclosing `switch sub` statements
	for _, line := range strings.Split(string(src), "\n") {
		if m := regexp.MustCompile(`^(\t+)switch sub \{`).FindStringSubmatch(line); m != nil {
			open = append(open, m[1])
			continue
		}
		if len(open) == 0 {
			continue
		}
		indent := open[len(open)-1]
		if line == indent+"}" {
			open = open[:len(open)-1]
			continue
		}
		if strings.HasPrefix(line, indent+"case ") {
			for _, n := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(line, -1) {
				if !seen[n[1]] {
					seen[n[1]] = true
					subs = append(subs, n[1])
				}
			}
		}
	}
	// insecure_skip_verify is taken by an if before the tls block's switch.
	if strings.Contains(string(src), `if sub == "insecure_skip_verify"`) {
		subs = append(subs, "insecure_skip_verify")
	}
	return subs
}

// readmeFence is a fenced block of README.md (or of a page of docs/) and
// the paragraph just before it.
type readmeFence struct {
	intro string // the paragraph just before the block, on one line
	info  string // the fence's info string (caddyfile, json, ...)
	body  string // the block, every line with its newline
	file  string // the file it is in
	line  int    // the line of the opening fence
}

// docFiles are the README and the pages of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) < 5 {
		t.Fatalf("docs/*.md: %v (%d pages)", err, len(pages))
	}
	return append([]string{"README.md"}, pages...)
}

// readmeFences returns every fenced block of README.md, in order.
func readmeFences(t *testing.T) []readmeFence {
	t.Helper()
	return docFences(t, "README.md")
}

// docFences returns every fenced block of a Markdown file, in order.
func docFences(t *testing.T, file string) []readmeFence {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	var out []readmeFence
	for i := 0; i < len(lines); i++ {
		open := strings.TrimRight(lines[i], "\n")
		indent := open[:len(open)-len(strings.TrimLeft(open, " "))]
		if !strings.HasPrefix(open[len(indent):], "```") {
			continue
		}
		f := readmeFence{info: strings.TrimPrefix(open[len(indent):], "```"), file: file, line: i + 1}
		var para []string
		for j := i - 1; j >= 0; j-- {
			l := strings.TrimSpace(lines[j])
			if l == "" && len(para) > 0 {
				break
			}
			if l != "" {
				para = append([]string{l}, para...)
			}
		}
		f.intro = strings.Join(para, " ")
		var body strings.Builder
		j := i + 1
		for ; j < len(lines) && strings.TrimRight(lines[j], "\n") != indent+"```"; j++ {
			body.WriteString(strings.TrimPrefix(lines[j], indent))
		}
		if j == len(lines) {
			t.Fatalf("%s:%d: fence never closed", file, i+1)
		}
		f.body = body.String()
		out = append(out, f)
		i = j
	}
	return out
}

// quotedFile matches the docs' way of saying that a block is a file of
// this repository: the paragraph before it ends with the path in backticks
// in parentheses and a colon, as in "On Redis (`examples/redis.Caddyfile`):".
var quotedFile = regexp.MustCompile("\\(`([^`]+)`\\):$")

// TestDocsQuoteFiles: every block the README or a page of docs/ introduces
// as a file of this repository ("(`examples/redis.Caddyfile`):" just before
// the fence) is that file, byte for byte, comments included; the README
// quotes the quick start's and the production example whole.
func TestDocsQuoteFiles(t *testing.T) {
	quoted := map[string]bool{}
	for _, doc := range docFiles(t) {
		for _, f := range docFences(t, doc) {
			m := quotedFile.FindStringSubmatch(f.intro)
			if m == nil {
				continue
			}
			path := m[1]
			if doc != "README.md" && strings.HasPrefix(path, "../") {
				path = strings.TrimPrefix(path, "../")
			}
			quoted[doc+" "+path] = true
			want, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s:%d quotes %s: %v", doc, f.line, path, err)
				continue
			}
			if f.body != string(want) {
				t.Errorf("%s:%d quotes %s, but the file differs from the quote:\n%s", doc, f.line, path, firstDifference("the quote", f.body, "the file", string(want)))
			}
		}
	}
	// If the convention drifts, these say so instead of passing on nothing.
	for _, want := range []string{"README.md examples/Caddyfile", "README.md examples/production.Caddyfile", "docs/redis.md examples/redis.Caddyfile", "docs/migrating.md examples/caddy-ratelimit.Caddyfile", "docs/reference.md examples/access-log.Caddyfile"} {
		if !quoted[want] {
			t.Errorf("%s does not quote %s with the (`path`): convention", strings.Fields(want)[0], strings.Fields(want)[1])
		}
	}
}

// TestReadmeLength: the README is the front door, read in minutes.
func TestReadmeLength(t *testing.T) {
	if n := strings.Count(readFile(t, "README.md"), "\n"); n > 350 {
		t.Errorf("README.md has %d lines, at most 350: move reference material to docs/", n)
	}
}

// firstDifference shows the first line where two texts part.
func firstDifference(gotName, got, wantName, want string) string {
	g, w := strings.SplitAfter(got, "\n"), strings.SplitAfter(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("  line %d of %s: %q\n  line %d of %s: %q", i+1, gotName, gl, i+1, wantName, wl)
		}
	}
	return "  (no line differs)"
}

// asIs matches a paragraph that introduces output shown as is.
var asIs = regexp.MustCompile(`\bas is\b[^:]*:$`)

// maskDate replaces the value of a Date header, which changes every second:
// the one part of the demo's output the README cannot show as it will be.
var maskDate = regexp.MustCompile(`(?m)^Date: .*$`)

// TestReadmeDemoOutput runs examples/demo.sh (with the Caddy the tests
// build) and compares its output with the README's copy, which the README
// calls "as is": every byte, but the value of the Date header. Every block
// the README calls output "as is" must be one a test produces.
func TestReadmeDemoOutput(t *testing.T) {
	var shown []readmeFence
	for _, doc := range docFiles(t) {
		for _, f := range docFences(t, doc) {
			if asIs.MatchString(f.intro) {
				if doc != "README.md" || !strings.Contains(f.intro, "`examples/demo.sh`") {
					t.Errorf("%s:%d calls output %q 'as is', but no test produces it", doc, f.line, f.intro)
					continue
				}
				shown = append(shown, f)
			}
		}
	}
	if len(shown) != 1 {
		t.Fatalf("README shows the demo's output %d times, want once", len(shown))
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("examples/demo.sh needs curl (apt-get install curl; .ci/run installs it)")
	}
	cmd := exec.Command("examples/demo.sh")
	cmd.Env = append(os.Environ(), "CADDY="+buildCaddy(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("examples/demo.sh: %v\n%s%s", err, out, stderr.String())
	}
	got := maskDate.ReplaceAllString(string(out), "Date: <masked>")
	want := maskDate.ReplaceAllString(shown[0].body, "Date: <masked>")
	if got != want {
		t.Fatalf("README.md:%d: the demo's output differs from the README's copy:\n%s\n\nthe demo printed:\n%s", shown[0].line, firstDifference("the README", want, "the demo", got), out)
	}
}

// readmeSection returns the text of the README section under "## <title>",
// up to the next "## " heading.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("README has no section %q", title)
	}
	sec, _, _ := strings.Cut(rest, "\n## ")
	return sec
}

// withoutFences drops fenced blocks (commands and output, not claims).
func withoutFences(text string) string {
	return regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```\\s*$").ReplaceAllString(text, "")
}

var (
	// statedTime is a time as the README writes one: "52 s", "4 min 12 s".
	statedTime = regexp.MustCompile(`\b\d+ min \d+ s\b|\b\d+ min\b|\b\d+(\.\d+)? s\b`)
	// vagueTime is a time stated without a measurement behind it.
	vagueTime = regexp.MustCompile(`(?i)\b(about|around|roughly|under|takes|took) (a|an|one|two|three|four|five|ten|a few|\d+(\.\d+)?) (seconds?|minutes?|min|hours?)\b`)
	// measuredBy is the line under the table: its source, date and machine.
	measuredBy = regexp.MustCompile("(?m)^Measured by `(docs/first-hour.sh)` on (\\d{4}-\\d{2}-\\d{2}): \\d+ vCPUs .+, \\d+ GiB, go\\d.*$")
)

// firstHourRecord is the output of docs/first-hour.sh's last run.
const firstHourRecord = "docs/first-hour.txt"

// TestReadmeTimesMeasured: the times the README states for installing,
// building, running and testing are measured ones. Every such time in the
// Install and Testing sections is a cell of the table of measured times,
// which says what measured it, when and on what machine, and is the
// record docs/first-hour.txt; neither the README nor a page of docs/ states
// a time like "about a minute".
func TestReadmeTimesMeasured(t *testing.T) {
	install := readmeSection(t, "Install")
	_, measured, ok := strings.Cut(install, "\n### Measured times\n")
	if !ok {
		t.Fatal("README's Install section has no '### Measured times'")
	}
	var table []string
	for _, l := range strings.Split(measured, "\n") {
		if strings.HasPrefix(l, "|") {
			table = append(table, l)
		}
	}
	if len(table) < 3 || !strings.Contains(table[0], "fresh machine") || !strings.Contains(table[0], "warm caches") {
		t.Fatalf("the table of measured times must have a header with 'fresh machine' and 'warm caches', and rows:\n%s", strings.Join(table, "\n"))
	}
	m := measuredBy.FindStringSubmatch(measured)
	if m == nil {
		t.Fatalf("no 'Measured by `docs/first-hour.sh` on <date>: <n> vCPUs ..., <n> GiB, go<version>' line under the table:\n%s", measured)
	}
	if _, err := os.Stat(m[1]); err != nil {
		t.Fatalf("the table's source: %v", err)
	}
	// The table and its line are the record of the script's last run, as
	// it printed them (make first-hour writes docs/first-hour.txt).
	record := readFile(t, firstHourRecord)
	if shown := strings.Join(table, "\n") + "\n\n" + m[0]; !strings.HasPrefix(record, shown) {
		t.Errorf("the README's table of measured times is not the record %s:\n%s", firstHourRecord, firstDifference("the README", shown, "the record", record))
	}
	cells := map[string]bool{}
	for _, row := range table[2:] {
		for _, c := range strings.Split(row, "|") {
			cells[strings.TrimSpace(c)] = true
		}
	}
	for _, title := range []string{"Install", "Testing"} {
		prose := withoutFences(readmeSection(t, title))
		for _, l := range strings.Split(prose, "\n") {
			if strings.HasPrefix(l, "|") {
				continue // the table itself
			}
			for _, tm := range statedTime.FindAllString(l, -1) {
				if !cells[tm] {
					t.Errorf("README, %s: %q states %q, which is not in the table of measured times", title, strings.TrimSpace(l), tm)
				}
			}
		}
	}
	for _, doc := range docFiles(t) {
		for _, v := range vagueTime.FindAllString(withoutFences(readFile(t, doc)), -1) {
			t.Errorf("%s states %q: measure it (docs/first-hour.sh) and refer to the README's table", doc, v)
		}
	}
}

// TestReadmeInstall: the install section's modules are what
// `caddy list-modules | grep sliding_ratelimit` prints for this repository's
// Caddy (cmd/caddy, which has the modules of the xcaddy build), and its
// xcaddy line builds the checkout the way `make xcaddy` and
// docs/first-hour.sh do.
func TestReadmeInstall(t *testing.T) {
	install := readmeSection(t, "Install")
	withArg := regexp.MustCompile(`(?m)^xcaddy build (--with github\.com/sliding-ratelimit/sliding_ratelimit@v0\.0\.0=\.)$`).FindStringSubmatch(install)
	if withArg == nil {
		t.Fatal("README's Install section has no line 'xcaddy build --with github.com/sliding-ratelimit/sliding_ratelimit@v0.0.0=.'")
	}
	for _, f := range []string{"Makefile", "docs/first-hour.sh"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), withArg[1]) {
			t.Errorf("%s does not build with %q, as the README does", f, withArg[1])
		}
	}
	out, err := exec.Command(buildCaddy(t), "list-modules").Output()
	if err != nil {
		t.Fatalf("caddy list-modules: %v", err)
	}
	var want string
	for _, l := range strings.SplitAfter(string(out), "\n") {
		if strings.Contains(l, "sliding_ratelimit") {
			want += l
		}
	}
	shown := false
	for _, f := range readmeFences(t) {
		if strings.Contains(install, f.body) && regexp.MustCompile(`^([a-z0-9_.]+\n)+$`).MatchString(f.body) {
			shown = true
			if f.body != want {
				t.Errorf("README.md:%d lists the modules\n%sbut caddy list-modules prints\n%s", f.line, f.body, want)
			}
		}
	}
	if !shown {
		t.Errorf("README's Install section does not show the modules list-modules prints:\n%s", want)
	}
	if !strings.Contains(install, "./caddy list-modules | grep sliding_ratelimit") {
		t.Error("README's Install section does not show how to list the modules")
	}
}

// headingSlug is the anchor GitHub gives a heading: lower case, without
// punctuation but hyphens and underscores, spaces as hyphens.
func headingSlug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// docAnchors returns the anchors of a Markdown file's headings.
func docAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, l := range strings.Split(withoutFences(readFile(t, file)), "\n") {
		if m := regexp.MustCompile(`^#+ (.*)$`).FindStringSubmatch(l); m != nil {
			out[headingSlug(m[1])] = true
		}
	}
	return out
}

// TestDocsLinks: every relative link of the README and docs/ reaches a file
// of this repository and, with an anchor, a heading of it: moving a section
// to another page must move the links to it.
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	links := 0
	for _, doc := range docFiles(t) {
		for _, m := range link.FindAllStringSubmatch(withoutFences(readFile(t, doc)), -1) {
			target := m[1]
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue // https:, mailto:
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			file := doc
			if path != "" {
				file = filepath.Join(filepath.Dir(doc), path)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links to %s: no such file (%s)", doc, target, file)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !docAnchors(t, file)[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", doc, target, file, anchor)
			}
		}
	}
	if links < 20 {
		t.Fatalf("found %d relative links in the README and docs/: the scan is broken", links)
	}
}
