package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// conformanceCase is one entry of testdata/conformance/cases.json (Istio's
// own capture test cases, with the goldens istio-iptables produced).
type conformanceCase struct {
	Name   string            `json:"name"`
	Flags  []string          `json:"flags"`
	Env    map[string]string `json:"env"`
	Inputs struct {
		HostFamily  string    `json:"host_primary_ip_family"`
		Nameservers *[]string `json:"resolv_conf_nameservers"`
		Groups      []string  `json:"groups_must_exist"`
	} `json:"inputs"`
	Config     map[string]any `json:"config"`
	GoldenFile string         `json:"golden_file"`
}

func loadCases(t *testing.T) []conformanceCase {
	t.Helper()
	data, err := os.ReadFile("testdata/conformance/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []conformanceCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 30 {
		t.Fatalf("cases.json has %d cases, want 30", len(cases))
	}
	return cases
}

// configFromCase is the config Istio's own test used for the case: its
// constructTestConfig() (ports, uid/gid 1337, mark, table, owner groups,
// loopback CIDR: Default's values) with the case's fields laid over it, DNS
// servers included as the literal strings Istio's test wrote. The same cases
// from their flags, environment and host inputs, through the CLI, are
// cmd/meshagent's TestIstioIptablesConformanceCLI.
func configFromCase(t *testing.T, c conformanceCase) RulesConfig {
	t.Helper()
	cfg := testRules(t)
	cfg.IptablesProbePort, cfg.ProbeTimeout = 0, 0 // not part of Istio's test config
	js, err := json.Marshal(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: config %s: %v", c.Name, js, err)
	}
	return cfg
}

// TestConformance feeds the builder the exact config Istio's test used for
// each of its 30 cases and compares the dry-run text (the restore inputs of
// both families) with Istio's golden, exactly (after trimming surrounding
// whitespace, as Istio's own comparison does).
func TestConformance(t *testing.T) {
	for _, c := range loadCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			golden, err := os.ReadFile(filepath.Join("testdata/conformance", c.GoldenFile))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(Build(configFromCase(t, c)).DryRunText())
			if want := strings.TrimSpace(string(golden)); got != want {
				t.Errorf("rules differ from %s\n%s", c.GoldenFile, testkit.LineDiff(want, got))
			}
		})
	}
}

// splitGolden returns a golden's IPv4 and IPv6 restore inputs: the blocks
// whose table names increase are IPv4, the rest IPv6.
func splitGolden(golden string) (v4, v6 string) {
	var blocks []string
	var cur strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(golden), "\n") {
		if strings.HasSuffix(l, "tables-save") {
			continue
		}
		cur.WriteString(l + "\n")
		if l == "COMMIT" {
			blocks = append(blocks, cur.String())
			cur.Reset()
		}
	}
	last, inV6 := "", false
	for _, b := range blocks {
		table := strings.TrimPrefix(strings.SplitN(b, "\n", 2)[0], "* ")
		if table <= last {
			inV6 = true
		}
		last = table
		if inV6 {
			v6 += b
		} else {
			v4 += b
		}
	}
	return v4, v6
}

// TestKernelConformance applies each golden's restore inputs and ours in a
// namespace and compares what the kernel holds (iptables-save, normalised):
// the semantic check, which also covers dns-uid-gid's address spelling.
func TestKernelConformance(t *testing.T) {
	// Own mount namespace too: the owner-group cases need groups "java" and
	// "ftp", given by a bind-mounted /etc/group only this test sees.
	if !inNetns(t, "-m", "--propagation", "private") {
		return
	}
	bindTestGroups(t)
	restore := func(bin, input string) error {
		if input == "" {
			return nil
		}
		cmd := exec.Command(bin, "--noflush")
		cmd.Stdin = strings.NewReader(input)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", bin, err, out)
		}
		return nil
	}
	// This namespace is the test's own: reset it completely between runs.
	reset := func() {
		for _, bin := range []string{"iptables", "ip6tables"} {
			for _, table := range []string{"filter", "mangle", "nat", "raw"} {
				sh(t, bin, "-t", table, "-F")
				sh(t, bin, "-t", table, "-X")
			}
		}
	}
	dump := func() string {
		return fmt.Sprint(saveState(t, false).Normalized()) + "\n" + fmt.Sprint(saveState(t, true).Normalized())
	}
	same := 0
	for _, c := range loadCases(t) {
		golden, err := os.ReadFile(filepath.Join("testdata/conformance", c.GoldenFile))
		if err != nil {
			t.Fatal(err)
		}
		if missingGroup(c.Inputs.Groups) != "" {
			t.Logf("%s: skipped, group %q does not exist here", c.Name, missingGroup(c.Inputs.Groups))
			continue
		}
		gv4, gv6 := splitGolden(string(golden))
		if err := errors.Join(restore("iptables-restore", gv4), restore("ip6tables-restore", gv6)); err != nil {
			t.Errorf("%s: golden does not apply: %v", c.Name, err)
			continue
		}
		want := dump()
		reset()
		rs := Build(configFromCase(t, c))
		if err := errors.Join(restore("iptables-restore", RestoreInput(rs.V4)), restore("ip6tables-restore", RestoreInput(rs.V6))); err != nil {
			t.Errorf("%s: ours does not apply: %v", c.Name, err)
			continue
		}
		if got := dump(); got != want {
			t.Errorf("%s: kernel state differs:\nours:   %s\ngolden: %s", c.Name, got, want)
		} else {
			same++
		}
		reset()
	}
	t.Logf("kernel conformance: %d cases give the same kernel state as the golden", same)
}

func missingGroup(groups []string) string {
	data, _ := os.ReadFile("/etc/group")
	for _, g := range groups {
		if !strings.Contains("\n"+string(data), "\n"+g+":") {
			return g
		}
	}
	return ""
}
