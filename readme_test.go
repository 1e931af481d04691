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
		if !regexp.MustCompile(`(?m)^test:\n\t\$\(GO\) test .*\./\.\.\.$`).Match(mk) {
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
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
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
