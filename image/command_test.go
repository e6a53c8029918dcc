package image

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The command as a user runs it: the agent's own binary, built as `make
// build` builds it, layers itself (and the meshagent-init beside it) onto
// the base, prints the digest the registry then serves, and exits 1 with
// the cause for a bad base, 2 for a bad command line.
func TestMeshagentImageCommand(t *testing.T) {
	if OwnPlatform() != "linux/amd64" && OwnPlatform() != "linux/arm64" {
		t.Skip("the test bases are linux/amd64 and linux/arm64")
	}
	dir := t.TempDir()
	for _, b := range [][2]string{{"meshagent", "../cmd/meshagent"}, {InitName, "../cmd/meshagent-init"}} {
		cmd := exec.Command("go", "build", "-ldflags", "-X main.buildVersion=v1.2.3-test", "-o", filepath.Join(dir, b[0]), b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b[0], err, out)
		}
	}
	bin := filepath.Join(dir, "meshagent")
	reg := serve(t)
	push(t, reg+"/istio/proxyv2:1.28.1", index(t))
	other := "linux/arm64"
	if OwnPlatform() == other {
		other = "linux/amd64"
	}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"image"}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}

	dest := reg + "/mesh/meshagent-proxyv2:1.28.1"
	code, stdout, stderr := run("--base", reg+"/istio/proxyv2:1.28.1", "--push", dest, "--agent", other+"="+agents[other].Agent)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	ref, _ := name.ParseReference(dest)
	head, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if digest, _, _ := strings.Cut(stdout, " "); digest != head.Digest.String() {
		t.Fatalf("printed %q, the registry has %s", stdout, head.Digest)
	}
	own, err := remote.Image(ref, remote.WithPlatform(*must(v1.ParsePlatform(OwnPlatform()))))
	if err != nil {
		t.Fatal(err)
	}
	was, err := remote.Image(must(name.ParseReference(reg+"/istio/proxyv2:1.28.1")), remote.WithPlatform(*must(v1.ParsePlatform(OwnPlatform()))))
	if err != nil {
		t.Fatal(err)
	}
	checkLayered(t, OwnPlatform(), was, own, BinariesBeside(bin), reg+"/istio/proxyv2:1.28.1@", "1.28.1 (the base's tag)")

	// Without --agent for the other platform: refused, nothing pushed.
	code, _, stderr = run("--base", reg+"/istio/proxyv2:1.28.1", "--push", reg+"/mesh/half:1")
	if code != 1 || !strings.Contains(stderr, "give --agent "+other+"=PATH") {
		t.Fatalf("exit %d, stderr %q; want 1 and the missing platform named", code, stderr)
	}
	if _, err := remote.Head(must(name.ParseReference(reg + "/mesh/half:1"))); err == nil {
		t.Fatal("mesh/half:1 was pushed")
	}
	for _, args := range [][]string{
		{"--push", dest},
		{"--base", "x", "--push", dest, "-o", "f.tar"},
		{"--base", "x", "-o", "f.tar", "--agent", "linux/arm64"},
	} {
		if code, _, stderr := run(args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}
