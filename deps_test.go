package slidingratelimit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// depsTools are the programs .ci/deps provides, with their Debian packages.
var depsTools = map[string]string{"redis-server": "redis-server", "redis-cli": "redis-tools", "curl": "curl", "promtool": "prometheus", "make": "make"}

// runDeps runs .ci/deps with PATH=dir only (no apt-get but one the test
// puts there, nothing of the system's) and returns its output and error.
func runDeps(t *testing.T, dir string, extraEnv ...string) (string, error) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, ".ci/deps")
	cmd.Env = append([]string{"PATH=" + dir, "HOME=" + t.TempDir()}, extraEnv...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// fakeTool writes an executable shell script named name into dir.
func fakeTool(t *testing.T, dir, name, script string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestDepsMissingWithoutAptGet: on a machine without the tools and without
// apt-get, make test's first step stops at once, names every missing tool
// and the one command that installs them, and fails.
func TestDepsMissingWithoutAptGet(t *testing.T) {
	out, err := runDeps(t, t.TempDir())
	if err == nil {
		t.Fatalf(".ci/deps succeeded with none of the tools on PATH:\n%s", out)
	}
	want := "deps: missing redis-server redis-cli curl promtool make; install them with:\n  apt-get install --no-install-recommends redis-server redis-tools curl prometheus make"
	if !strings.HasPrefix(out, want) {
		t.Fatalf(".ci/deps said\n%s\nwant it to start with\n%s", out, want)
	}
}

// TestDepsPresent: with every tool on PATH, .ci/deps does nothing: no
// output, and apt-get (a fake that records being called) is not run.
func TestDepsPresent(t *testing.T) {
	dir := t.TempDir()
	for tool := range depsTools {
		fakeTool(t, dir, tool, "exit 0")
	}
	called := filepath.Join(t.TempDir(), "apt-get-called")
	fakeTool(t, dir, "apt-get", "echo \"$@\" >>"+called)
	out, err := runDeps(t, dir)
	if err != nil || out != "" {
		t.Fatalf(".ci/deps with every tool present: %v, output %q", err, out)
	}
	if _, err := os.Stat(called); err == nil {
		t.Fatal(".ci/deps ran apt-get although nothing was missing")
	}
}

// TestDepsInstalls: with apt-get (a fake here, on a PATH of the test's own)
// .ci/deps installs the missing tools' packages, without recommends and
// with services kept from starting (policy-rc.d in place while apt-get
// runs, gone after); as a user other than root it names the command instead.
func TestDepsInstalls(t *testing.T) {
	dir := t.TempDir()
	fakeTool(t, dir, "curl", "exit 0")
	fakeTool(t, dir, "make", "exit 0")
	for _, tool := range []string{"chmod", "rm"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(t.TempDir(), "apt-get.log")
	policy := filepath.Join(t.TempDir(), "policy-rc.d")
	// The fake apt-get records its arguments and whether policy-rc.d
	// refuses services at that moment, then "installs" by creating the tools.
	fakeTool(t, dir, "apt-get", `echo "$DEBIAN_FRONTEND $* policy=$(`+policy+`; echo $?)" >>`+log+`
case "$1" in install) for tool in redis-server redis-cli promtool; do printf '#!/bin/sh\n' >`+dir+`/$tool; done; chmod +x `+dir+`/redis-server `+dir+`/redis-cli `+dir+`/promtool;; esac`)
	out, err := runDeps(t, dir, "DEPS_POLICY_RC_D="+policy)
	if os.Geteuid() != 0 {
		if err == nil || !strings.Contains(out, "sudo .ci/deps") {
			t.Fatalf("as a user other than root, .ci/deps should name `sudo .ci/deps`: %v\n%s", err, out)
		}
		return
	}
	if err != nil {
		t.Fatalf(".ci/deps with a working apt-get: %v\n%s", err, out)
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := "noninteractive update -qq policy=101\nnoninteractive install -y -qq --no-install-recommends redis-server redis-tools prometheus policy=101\n"
	if string(got) != want {
		t.Fatalf("apt-get was run as\n%swant\n%s", got, want)
	}
	if _, err := os.Stat(policy); err == nil {
		t.Fatal(".ci/deps left its policy-rc.d behind")
	}
}
