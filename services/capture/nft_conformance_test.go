package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// nftCases is testdata/conformance-nft/cases.json: Istio's 28 nftables test
// cases (tools/istio-nftables/pkg/capture/run_test.go), each as the fields it
// sets over a common base, with Istio's golden output beside it (#23).
type nftCases struct {
	Base  map[string]any `json:"base"`
	Cases []struct {
		Name string         `json:"name"`
		Set  map[string]any `json:"set"`
	} `json:"cases"`
}

type nftCase struct {
	name   string
	cfg    RulesConfig
	golden string
}

func loadNftCases(t *testing.T) []nftCase {
	t.Helper()
	const dir = "testdata/conformance-nft"
	data, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cs nftCases
	if err := json.Unmarshal(data, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Cases) != 28 {
		t.Fatalf("cases.json has %d cases, want 28", len(cs.Cases))
	}
	var out []nftCase
	for _, c := range cs.Cases {
		// Istio's constructTestConfig(): only the base fields, nothing of
		// testRules(t) beyond them; then the case's fields.
		var cfg RulesConfig
		for _, layer := range []map[string]any{cs.Base, c.Set} {
			js, _ := json.Marshal(layer)
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&cfg); err != nil {
				t.Fatalf("%s: config %s: %v", c.Name, js, err)
			}
		}
		golden, err := os.ReadFile(filepath.Join(dir, c.Name+".golden"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, nftCase{name: c.Name, cfg: cfg, golden: string(golden)})
	}
	return out
}

// TestNftConformance renders each of Istio's 28 nftables cases with our
// builder and compares the nft -f input with Istio's golden, exactly (after
// trimming surrounding whitespace, as Istio's comparison does).
func TestNftConformance(t *testing.T) {
	for _, c := range loadNftCases(t) {
		t.Run(c.name, func(t *testing.T) {
			got := strings.TrimSpace(BuildNft(c.cfg).Text())
			if want := strings.TrimSpace(c.golden); got != want {
				t.Errorf("rules differ from %s.golden\n%s", c.name, testkit.LineDiff(want, got))
			}
		})
	}
}

// TestNftKernelConformance loads each golden, then ours, with nft -f into a
// fresh network namespace and compares what the kernel holds (nft -s list
// ruleset): the goldens are valid nft input on this kernel, and ours gives
// the same tables.
func TestNftKernelConformance(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (Debian package nftables)")
	}
	// Own mount namespace too: the owner-group cases name groups "java" and
	// "ftp", which nft resolves from /etc/group when it parses the rules.
	if !inNetns(t, "-m", "--propagation", "private") {
		return
	}
	bindTestGroups(t)
	a, err := NewNftApplier(testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// load applies input, returns the kernel's listing, runs check on that
	// state, then empties the namespace again.
	load := func(input string, check func()) string {
		t.Helper()
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(input)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "error: " + err.Error() + ": " + string(out)
		}
		out, err := exec.Command("nft", "-s", "list", "ruleset").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list ruleset: %v: %s", err, out)
		}
		check()
		sh(t, "nft", "flush", "ruleset")
		return string(out)
	}
	same := 0
	for _, c := range loadNftCases(t) {
		want := load(c.golden, func() {})
		if strings.HasPrefix(want, "error: ") {
			t.Errorf("%s: golden does not load: %s", c.name, want)
			continue
		}
		// What the sidecar's check reads agrees: nothing missing.
		rs := BuildNft(c.cfg)
		got := load(rs.Text(), func() {
			if missing, err := a.Missing(context.Background(), rs); err != nil || len(missing) > 0 {
				t.Errorf("%s: Missing = %q, %v; want nothing", c.name, missing, err)
			}
		})
		if got != want {
			t.Errorf("%s: kernel state differs\n%s", c.name, testkit.LineDiff(want, got))
		} else {
			same++
		}
	}
	t.Logf("nft kernel conformance: %d cases load and give the golden's kernel state", same)
}

// bindTestGroups gives this mount namespace an /etc/group with the groups
// Istio's owner-group cases name ("java", "ftp") when the host lacks them.
func bindTestGroups(t *testing.T) {
	t.Helper()
	if missingGroup([]string{"java", "ftp"}) == "" {
		return
	}
	data, _ := os.ReadFile("/etc/group")
	groups := filepath.Join(t.TempDir(), "group")
	os.WriteFile(groups, append(data, "java:x:64901:\nftp:x:64902:\n"...), 0o644)
	if out, err := exec.Command("mount", "--bind", groups, "/etc/group").CombinedOutput(); err != nil {
		t.Logf("cannot bind-mount /etc/group (owner-group cases will fail): %v: %s", err, out)
		return
	}
	t.Cleanup(func() { exec.Command("umount", "/etc/group").Run() })
}
