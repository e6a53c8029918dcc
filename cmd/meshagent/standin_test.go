package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

// The agent's first log line names the Envoy it runs, and says when that is
// the stand-in (#20): the image ships the stand-in as /usr/local/bin/envoy,
// where only its build information tells it from a real Envoy.
func TestDescribeEnvoyNamesTheStandIn(t *testing.T) {
	if os.Getenv("MESHAGENT_TEST_ENVOY") != "" {
		t.Skip("MESHAGENT_TEST_ENVOY replaces the stand-in built for this test")
	}
	if got := describeEnvoy(e2ekit.EnvoyBinary); !strings.HasPrefix(got, e2ekit.EnvoyBinary+" (the stand-in Envoy") {
		t.Errorf("describeEnvoy(the stand-in) = %q, want its path and that it is the stand-in", got)
	}
	// Another Go binary (the agent) and a missing file are not the stand-in.
	for _, p := range []string{e2ekit.AgentBinary, "/nonexistent/envoy"} {
		if got := describeEnvoy(p); got != p {
			t.Errorf("describeEnvoy(%s) = %q, want the path alone", p, got)
		}
	}
}

// Installed as Istio's agent, the binary's help and errors say pilot-agent,
// the name Istio's injector, hooks and tools call it by (#20).
func TestHelpSaysTheNameItWasCalledBy(t *testing.T) {
	for argv0, want := range map[string]string{
		"/usr/local/bin/pilot-agent":   "pilot-agent",
		"/usr/local/bin/meshagent":     "meshagent",
		"/tmp/go-build/meshagent.test": "meshagent",
	} {
		name := calledAs(argv0)
		if name != want {
			t.Errorf("calledAs(%q) = %q, want %q", argv0, name, want)
		}
		for _, args := range [][]string{{"--help"}, {"wait", "--help"}, {"istio-iptables", "--help"}} {
			var out, errb bytes.Buffer
			if code := execute(&cliContext{name: name, args: args, host: realHost(), stdout: &out, stderr: &errb}); code != 0 {
				t.Fatalf("%s %q: exit %d, stderr %q", name, args, code, errb.String())
			}
			usage := name + " " + strings.TrimSuffix(strings.Join(args, " "), "--help")
			if !strings.Contains(out.String(), "Usage:\n  "+usage) {
				t.Errorf("%s %q: no %q in the help:\n%s", name, args, "Usage:\n  "+usage, out.String())
			}
		}
		var out, errb bytes.Buffer
		if code := execute(&cliContext{name: name, args: []string{"wait", "--bogus"}, host: realHost(), stdout: &out, stderr: &errb}); code != 2 ||
			!strings.HasPrefix(errb.String(), name+": ") {
			t.Errorf("%s wait --bogus: exit %d, stderr %q; want 2 and the error prefixed by %q", name, code, errb.String(), name)
		}
	}
}
