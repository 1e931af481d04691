package slidingratelimit

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
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
// serve with no Redis and limit requests (5 admitted, then 429).
func TestReadmeRunCommand(t *testing.T) {
	run, _ := readmeCommands(t)
	args := strings.Fields(run)
	cmd := exec.Command(args[0], args[1:]...)
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
		resp, err := client.Get("http://localhost:2019/config/")
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
		resp, err := client.Get("http://localhost:8080/")
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

// TestReadmeACL: the ACL line in the README grants every command the
// scripts run (the same list TestACL proves sufficient on a real Redis).
func TestReadmeACL(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^\s*ACL SETUSER ratelimit .*$`).Find(b)
	if line == nil {
		t.Fatal("README has no ACL SETUSER ratelimit line")
	}
	granted := map[string]bool{}
	for _, f := range strings.Fields(string(line)) {
		granted[f] = true
	}
	for _, c := range limiterACLCommands(t) {
		if !granted[c] {
			t.Errorf("README's ACL line lacks %s, which the limiter needs", c)
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

// TestReadmeReferenceMatchesSyntax: the README's Caddyfile reference is the
// Syntax block of UnmarshalCaddyfile, line for line; every subdirective the
// parser accepts is in it and has a row in the README's tables.
func TestReadmeReferenceMatchesSyntax(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile("(?s)## Caddyfile reference\n\n```caddyfile\n(.*?)```").FindSubmatch(b)
	if ref == nil {
		t.Fatal("README has no Caddyfile reference block")
	}
	var readme []string
	for _, l := range strings.Split(strings.TrimRight(string(ref[1]), "\n"), "\n") {
		readme = append(readme, strings.Join(strings.Fields(l), " "))
	}
	code := syntaxFromCode(t)
	if strings.Join(readme, "\n") != strings.Join(code, "\n") {
		t.Fatalf("README reference and the Syntax comment differ:\nREADME:\n%s\n\ncaddyfile.go:\n%s", strings.Join(readme, "\n"), strings.Join(code, "\n"))
	}
	syntax := strings.Join(code, "\n")
	subs := parsedSubdirectives(t)
	if len(subs) < 30 {
		t.Fatalf("found only %d subdirectives in caddyfile.go: %v", len(subs), subs)
	}
	for _, sub := range subs {
		if !regexp.MustCompile(`(?m)^` + sub + `\b`).MatchString(syntax) {
			t.Errorf("subdirective %q is parsed but missing from the Syntax block", sub)
		}
		if !strings.Contains(string(b), "`"+sub+"`") && !strings.Contains(string(b), "`"+sub+" ") {
			t.Errorf("subdirective %q is not described in the README", sub)
		}
	}
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

// readmeFence is a fenced block of README.md and the line just before it.
type readmeFence struct {
	intro string // the paragraph just before the block, on one line
	info  string // the fence's info string (caddyfile, json, ...)
	body  string // the block, every line with its newline
	line  int    // the README line of the opening fence
}

// readmeFences returns every fenced block of README.md, in order.
func readmeFences(t *testing.T) []readmeFence {
	t.Helper()
	b, err := os.ReadFile("README.md")
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
		f := readmeFence{info: strings.TrimPrefix(open[len(indent):], "```"), line: i + 1}
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
			t.Fatalf("README.md:%d: fence never closed", i+1)
		}
		f.body = body.String()
		out = append(out, f)
		i = j
	}
	return out
}

// quotedFile matches the README's way of saying that a block is a file of
// this repository: the paragraph before it ends with the path in backticks
// in parentheses and a colon, as in "On Redis (`examples/redis.Caddyfile`):".
var quotedFile = regexp.MustCompile("\\(`([^`]+)`\\):$")

// TestReadmeQuotesFiles: every block the README introduces as a file of this
// repository ("(`examples/redis.Caddyfile`):" just before the fence) is that
// file, byte for byte, comments included.
func TestReadmeQuotesFiles(t *testing.T) {
	quoted := 0
	for _, f := range readmeFences(t) {
		m := quotedFile.FindStringSubmatch(f.intro)
		if m == nil {
			continue
		}
		quoted++
		want, err := os.ReadFile(m[1])
		if err != nil {
			t.Errorf("README.md:%d quotes %s: %v", f.line, m[1], err)
			continue
		}
		if f.body != string(want) {
			t.Errorf("README.md:%d quotes %s, but the file differs from the quote:\n%s", f.line, m[1], firstDifference("the quote", f.body, "the file", string(want)))
		}
	}
	// The examples the README shows (the quick start, Redis, the access log,
	// the conversion from caddy-ratelimit) are quoted this way: if the
	// convention drifts, this count says so instead of passing on nothing.
	if quoted < 4 {
		t.Fatalf("README quotes %d files with the (`path`): convention, want at least 4", quoted)
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
	for _, f := range readmeFences(t) {
		if asIs.MatchString(f.intro) {
			if !strings.Contains(f.intro, "`examples/demo.sh`") {
				t.Errorf("README.md:%d calls output %q 'as is', but no test produces it", f.line, f.intro)
				continue
			}
			shown = append(shown, f)
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
	measuredBy = regexp.MustCompile("(?m)^Measured by `(docs/first-hour.sh)` on (\\d{4}-\\d{2}-\\d{2}): \\d+ vCPUs .+, \\d+ GiB, go\\d")
)

// TestReadmeTimesMeasured: the times the README states for installing,
// building, running and testing are measured ones. Every such time in the
// Install and Testing sections is a cell of the table of measured times,
// which says what measured it, when and on what machine; no section of the
// README states a time like "about a minute".
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
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vagueTime.FindAllString(withoutFences(string(b)), -1) {
		t.Errorf("README states %q: measure it (docs/first-hour.sh) and refer to the table", v)
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
