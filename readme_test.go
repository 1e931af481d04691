package slidingratelimit

import (
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
		if !regexp.MustCompile(`(?m)^test:\n(?:\t.*\n)*?\t.*\$\(GO\) test [^\n]*\./\.\.\.`).Match(mk) {
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
	deadline := time.Now().Add(90 * time.Second) // go run may compile first
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
