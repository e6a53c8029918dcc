package conformance

// The differential conformance suite against Istio's own agent.
//
// `make conformance` (MESHAGENT_CONFORMANCE=1): for every case, Istio's
// pilot-agent and meshagent run on the same inputs with a stand-in Envoy
// that records its command line and bootstrap; the two are compared
// (conformance_compare_test.go), meshagent's in-process pipeline is checked
// against its binary, and Istio's output against the golden checked in
// under testdata. `make conformance-update`
// (MESHAGENT_CONFORMANCE=update) rewrites the goldens from the run.
//
// `make test`: every golden's case is replayed through meshagent alone and
// compared with Istio's recorded output; neither Istio's binary nor its
// source is needed (a case that reads a file of Istio's source, Istio's
// bootstrap template, is skipped without it).
//
// Both print one summary line:
//
//	conformance: N/M cases equal (bootstrap), K/L (args), ...

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

const goldenDir = "testdata"

// confGolden is a golden file: the case and Istio's output on it.
type confGolden struct {
	Case  confCase   `json:"case"`
	Istio confOutput `json:"istio"`
}

// conformanceKnownGaps are cases known to differ for a reason not yet
// fixed; they are counted as different in the summary but do not fail the
// test, and one that turns equal fails it until it is removed from here.
var conformanceKnownGaps = map[string]string{}

// caseResult is one case's comparison, aspect by aspect (nil: not compared).
type caseResult struct {
	c                                confCase
	bootstrap, args, outcome, status *comparison
	problem                          string // the case could not be compared: why
}

func (r caseResult) equal() bool {
	for _, c := range []*comparison{r.bootstrap, r.args, r.outcome, r.status} {
		if c != nil && !c.equal() {
			return false
		}
	}
	return r.problem == ""
}

// compareOutputs compares meshagent's output with Istio's on a case.
func compareOutputs(c confCase, istio, ours confOutput) caseResult {
	r := caseResult{c: c}
	outcome := func() *comparison {
		var diffs []fieldDiff
		if istio.Outcome != ours.Outcome {
			diffs = append(diffs, fieldDiff{Path: "outcome", Istio: strconv.Quote(istio.Outcome), Ours: strconv.Quote(ours.Outcome)})
		}
		if istio.ExitCode != ours.ExitCode {
			diffs = append(diffs, fieldDiff{Path: "exit_code", Istio: strconv.Itoa(istio.ExitCode), Ours: strconv.Itoa(ours.ExitCode)})
		}
		if c.OnPurpose != "" && len(diffs) > 0 {
			// The case shows a difference docs/conformance.md lists: how it ends may differ.
			for i := range diffs {
				diffs[i].Reason = "on purpose: " + c.OnPurpose
			}
			return &comparison{allowed: diffs}
		}
		cmp := classify(diffs)
		return &cmp
	}
	switch c.Kind {
	case kindExit:
		r.outcome = outcome()
	case kindStatus:
		var diffs []fieldDiff
		for i := range max(len(istio.Status), len(ours.Status)) {
			var a, b statusAnswer
			if i < len(istio.Status) {
				a = istio.Status[i]
			}
			if i < len(ours.Status) {
				b = ours.Status[i]
			}
			if a != b {
				diffs = append(diffs, fieldDiff{Path: "status[" + a.Request + b.Request + "]", Istio: strconv.Itoa(a.Code), Ours: strconv.Itoa(b.Code)})
			}
		}
		cmp := classify(diffs)
		r.status = &cmp
	default:
		if istio.Outcome != outcomeStarted || ours.Outcome != outcomeStarted {
			r.outcome = outcome()
			r.problem = fmt.Sprintf("Envoy not started: Istio %s, meshagent %s", istio.Outcome, ours.Outcome)
			if !r.outcome.equal() {
				r.problem = ""
			}
			// Neither has a bootstrap to compare; both count as different.
			empty := comparison{diffs: []fieldDiff{{Path: "(no bootstrap)", Istio: istio.Outcome, Ours: ours.Outcome}}}
			r.bootstrap, r.args = &empty, &empty
			return r
		}
		args := compareArgs(istio.Args, ours.Args, istio.norm, ours.norm)
		r.args = &args
		boot, err := compareBootstraps(istio.bootstrap(), ours.bootstrap(), istio.norm, ours.norm)
		if err != nil {
			boot = comparison{diffs: []fieldDiff{{Path: "(parse)", Ours: err.Error()}}}
		}
		r.bootstrap = &boot
	}
	return r
}

// report logs a case's differences and fails the test on those not allowed.
func report(t *testing.T, r caseResult) {
	t.Helper()
	for _, c := range []*comparison{r.bootstrap, r.args, r.outcome, r.status} {
		if c == nil {
			continue
		}
		for _, d := range c.allowed {
			t.Logf("allowed: %s (%s)", d, d.Reason)
		}
	}
	if r.problem != "" {
		t.Errorf("%s", r.problem)
	}
	gap, known := conformanceKnownGaps[r.c.Name]
	if r.equal() {
		if known {
			t.Errorf("case %s is listed in conformanceKnownGaps (%s) but now agrees with Istio: remove it from the list", r.c.Name, gap)
		}
		return
	}
	var lines []string
	for _, c := range []*comparison{r.bootstrap, r.args, r.outcome, r.status} {
		if c != nil {
			for _, d := range c.diffs {
				lines = append(lines, "  "+d.String())
			}
		}
	}
	msg := fmt.Sprintf("meshagent differs from Istio's agent on %s (%s):\n%s", r.c.Name, r.c.Note, strings.Join(lines, "\n"))
	if known {
		t.Logf("known gap (%s): %s", gap, msg)
		return
	}
	t.Error(msg)
}

// summary is the one line both modes print.
func summary(results []caseResult) string {
	count := func(pick func(caseResult) *comparison) (equal, total int) {
		for _, r := range results {
			if c := pick(r); c != nil {
				total++
				if c.equal() {
					equal++
				}
			}
		}
		return
	}
	bn, bm := count(func(r caseResult) *comparison { return r.bootstrap })
	an, am := count(func(r caseResult) *comparison { return r.args })
	en, em := count(func(r caseResult) *comparison {
		if r.c.Kind == kindExit {
			return r.outcome
		}
		return nil
	})
	sn, sm := 0, 0
	allowed := map[string]bool{}
	for _, r := range results {
		for _, c := range []*comparison{r.bootstrap, r.args, r.outcome, r.status} {
			if c != nil {
				for _, d := range c.allowed {
					allowed[d.Path] = true
				}
			}
		}
		if r.c.Kind != kindStatus || r.status == nil {
			continue
		}
		sm += len(r.c.Requests) + 1
		sn += len(r.c.Requests) + 1 - len(r.status.diffs)
	}
	equal := 0
	for _, r := range results {
		if r.equal() {
			equal++
		}
	}
	return fmt.Sprintf("conformance: %d/%d cases equal (bootstrap), %d/%d (args), %d/%d (exit codes and outcomes), %d/%d (status paths); %d/%d cases equal overall, %d allowed differences",
		bn, bm, an, am, en, em, sn, sm, equal, len(results), len(allowed))
}

// TestConformance compares meshagent with Istio's agent: live with
// MESHAGENT_CONFORMANCE set, else against the checked-in goldens.
func TestConformance(t *testing.T) {
	mode := os.Getenv("MESHAGENT_CONFORMANCE")
	var results []caseResult
	switch mode {
	case "":
		results = conformanceGolden(t)
	case "1", "update":
		results = conformanceLive(t, mode == "update")
	default:
		t.Fatalf("MESHAGENT_CONFORMANCE=%q: want 1 or update", mode)
	}
	line := summary(results)
	t.Log(line)
	fmt.Println(line)
}

// conformanceGolden replays every golden through meshagent alone.
func conformanceGolden(t *testing.T) []caseResult {
	goldens, err := readGoldens()
	if err != nil {
		t.Fatal(err)
	}
	if len(goldens) == 0 {
		t.Fatalf("no goldens in %s: run make conformance-update", goldenDir)
	}
	istioSrc, _ := e2ekit.IstioSource() // optional here
	checkGoldensMatchCases(t, goldens, istioSrc)
	netns, why := e2ekit.CanUseNetns()
	var results []caseResult
	for _, g := range goldens {
		c := g.Case
		t.Run(c.Name, func(t *testing.T) {
			if c.Kind == kindBootstrap && needsIstioSource(c) && istioSrc == "" {
				t.Skip("reads Istio's bootstrap template: set MESHAGENT_ISTIO_SRC")
			}
			istio := g.Istio
			istio.norm = normalizer{Root: "<root>", envoy: "<envoy>"}
			var ours confOutput
			switch c.Kind {
			case kindBootstrap:
				ours = runOursInProcess(t, c, istioSrc)
			case kindExit:
				if istio.Outcome == outcomeStarted && c.isProxy() && !netns {
					t.Skipf("runs the agent with Istio's ports: %s", why)
				}
				ours = runAgentCase(t, c, e2ekit.AgentBinary, true, netns && c.isProxy(), istioSrc)
			case kindStatus:
				ours = runStatusCase(t, c, e2ekit.AgentBinary, true, istioSrc)
			}
			r := compareOutputs(c, istio, ours)
			if !r.equal() && ours.log != "" {
				t.Logf("meshagent's output:\n%s", ours.log)
			}
			report(t, r)
			results = append(results, r)
		})
	}
	return results
}

// conformanceLive runs both agents on every case.
func conformanceLive(t *testing.T, update bool) []caseResult {
	istioAgent, istioSrc, err := e2ekit.IstioPeer()
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := e2ekit.CanUseNetns(); !ok {
		t.Fatalf("the live suite %s", why)
	}
	cases, err := conformanceCases(istioSrc)
	if err != nil {
		t.Fatal(err)
	}
	goldens, err := readGoldens()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]confGolden{}
	for _, g := range goldens {
		byName[g.Case.Name] = g
	}
	var results []caseResult
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var istio, ours confOutput
			switch c.Kind {
			case kindBootstrap, kindExit:
				istio = runAgentCase(t, c, istioAgent, false, c.isProxy(), istioSrc)
				ours = runAgentCase(t, c, e2ekit.AgentBinary, true, c.isProxy(), istioSrc)
			case kindStatus:
				istio = runStatusCase(t, c, istioAgent, false, istioSrc)
				ours = runStatusCase(t, c, e2ekit.AgentBinary, true, istioSrc)
			}
			r := compareOutputs(c, istio, ours)
			if !r.equal() {
				t.Logf("Istio's agent's output:\n%s\nmeshagent's output:\n%s", e2ekit.Tail(istio.log, 40), e2ekit.Tail(ours.log, 40))
			}
			report(t, r)
			results = append(results, r)

			// The in-process pipeline `make test` uses gives what the binary gives.
			if c.Kind == kindBootstrap {
				inproc := runOursInProcess(t, c, istioSrc)
				self := compareOutputs(c, ours, inproc)
				if !self.equal() {
					t.Errorf("meshagent in-process differs from the meshagent binary on %s: %v %v %v", c.Name, self.bootstrap, self.args, self.outcome)
				}
			}

			g := confGolden{Case: c, Istio: goldenOutput(istio)}
			if update {
				if err := writeGolden(g); err != nil {
					t.Fatal(err)
				}
				return
			}
			old, ok := byName[c.Name]
			if !ok {
				t.Errorf("no golden for case %s: run make conformance-update", c.Name)
				return
			}
			old.Istio.norm = normalizer{Root: "<root>", envoy: "<envoy>"}
			g.Istio.norm = old.Istio.norm
			if same := compareOutputs(c, old.Istio, g.Istio); !same.equal() || jsonText(old.Case) != jsonText(c) {
				t.Errorf("the golden of %s is not what Istio's agent does now: run make conformance-update", c.Name)
			}
		})
	}
	if update {
		removeStaleGoldens(t, cases)
	}
	return results
}

// goldenOutput is Istio's output as stored: the stand-in's path and the
// agent's directory written as <envoy> and <root>.
func goldenOutput(o confOutput) confOutput {
	replace := func(s string) string {
		s = strings.ReplaceAll(s, o.norm.envoy, "<envoy>")
		return strings.ReplaceAll(s, o.norm.Root, "<root>")
	}
	g := confOutput{Outcome: o.Outcome, ExitCode: o.ExitCode, Status: o.Status}
	for _, a := range o.Args {
		g.Args = append(g.Args, replace(a))
	}
	if len(o.Bootstrap) > 0 {
		var buf bytes.Buffer
		text := []byte(replace(string(o.Bootstrap)))
		if json.Indent(&buf, text, "", "  ") == nil {
			text = buf.Bytes()
		}
		g.Bootstrap = text
	}
	g.BootstrapYAML = replace(o.BootstrapYAML)
	return g
}

func writeGolden(g confGolden) error {
	b, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(goldenDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(goldenDir, g.Case.Name+".json"), append(b, '\n'), 0o644)
}

func readGoldens() ([]confGolden, error) {
	paths, err := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []confGolden
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var g confGolden
		if err := json.Unmarshal(b, &g); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, g)
	}
	return out, nil
}

// removeStaleGoldens deletes goldens of cases that are gone.
func removeStaleGoldens(t *testing.T, cases []confCase) {
	paths, _ := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		if !slices.ContainsFunc(cases, func(c confCase) bool { return c.Name == name }) {
			if err := os.Remove(p); err != nil {
				t.Error(err)
			}
		}
	}
}

// checkGoldensMatchCases fails when the case table and the goldens have
// parted: a golden's inputs are not the table's (or a case has no golden).
// Istio's golden inputs are checked only with Istio's source at hand.
func checkGoldensMatchCases(t *testing.T, goldens []confGolden, istioSrc string) {
	t.Helper()
	cases, err := conformanceCases(istioSrc)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]confCase{}
	for _, g := range goldens {
		byName[g.Case.Name] = g.Case
	}
	for _, c := range cases {
		g, ok := byName[c.Name]
		switch {
		case !ok:
			t.Errorf("case %s has no golden: run make conformance-update", c.Name)
		case jsonText(g) != jsonText(c):
			t.Errorf("the golden of %s was recorded from other inputs: run make conformance-update", c.Name)
		}
	}
}

func needsIstioSource(c confCase) bool {
	for _, v := range c.Files {
		if strings.HasPrefix(v, "@istio:") {
			return true
		}
	}
	return false
}
