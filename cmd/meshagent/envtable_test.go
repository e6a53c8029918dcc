package main

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// fullEnv sets the variables whose reads depend on others (CA_ADDR unset
// makes ISTIOD_SAN the CA's name; OUTPUT_CERTS makes KUBERNETES_SERVICE_HOST
// count), so that one start takes every path of the builders.
func fullEnv() map[string]string {
	return map[string]string{
		"POD_NAME": "app-0", "POD_NAMESPACE": "ns", "SERVICE_ACCOUNT": "sa", "INSTANCE_IP": "10.1.2.3",
		"PROV_CERT": "/etc/prov", "OUTPUT_CERTS": "/etc/out", "ISTIOD_SAN": "istiod.istio-system.svc",
		"ISTIO_META_CLUSTER_ID": "c1", "ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:15053",
		"KUBERNETES_SERVICE_HOST": "10.0.0.1", "ISTIO_META_FOO": "bar", "CA_HEADER_X": "y", "XDS_HEADER_X": "y",
	}
}

// readByCaptureToo are the variables istio-iptables' settings read as
// aliases of their own (--redirect-dns, --dual-stack) besides the DNS
// proxy's and Envoy's configs: two readers by design, one report of a bad
// value (config.Value).
var readByCaptureToo = map[string]bool{"ISTIO_DUAL_STACK": true, "ISTIO_META_DNS_CAPTURE": true}

// One start of the proxy command (flags resolved, then buildAgentConfig)
// reads each variable at most once, and only variables of the table (#26:
// PROV_CERT was read three times, INSTANCE_IP parsed twice, and a bad
// value of a variable read twice was reported twice).
func TestEachVariableReadOnce(t *testing.T) {
	for name, env := range map[string]map[string]string{"empty": nil, "full": fullEnv()} {
		t.Run(name, func(t *testing.T) {
			host := testHost(t, env)
			if _, err := parseOnHost(t, host, "--root", testRoot(t)); err != nil {
				t.Fatal(err)
			}
			checkReadOnce(t, host.env.Reads())
		})
	}
}

// standalone layers its defaults on the environment: the builders read that
// layer once per variable too.
func TestStandaloneReadsEachVariableOnce(t *testing.T) {
	cfg, _, err := parseStandalone(t, newStandaloneHost(t, nil), "--root", testRoot(t), "--mesh", sampleMesh(t))
	if err != nil {
		t.Fatal(err)
	}
	checkReadOnce(t, cfg.env.Reads())
}

// checkReadOnce: one start read each variable at most once (but the
// readByCaptureToo pair), and only variables of the table.
func checkReadOnce(t *testing.T, reads map[string]int) {
	t.Helper()
	if len(reads) == 0 {
		t.Fatal("no variable read through the config's reader")
	}
	for _, name := range slices.Sorted(maps.Keys(reads)) {
		if n := reads[name]; n > 1 && !readByCaptureToo[name] {
			t.Errorf("%s read %d times in one start", name, n)
		}
		if _, ok := config.Find(name); !ok {
			t.Errorf("%s read, but not in config.Env", name)
		}
	}
}

// istio-iptables' flags read their variables through the same reader, and
// each is in the table.
func TestCaptureVariablesInTable(t *testing.T) {
	cmd := bindCaptureSettings(pflag.NewFlagSet("istio-iptables", pflag.ContinueOnError))
	host := hostInputs{env: mapEnvironment(nil)}
	if _, err := cmd.config(host); err != nil {
		t.Fatal(err)
	}
	for name := range host.env.Reads() {
		if _, ok := config.Find(name); !ok {
			t.Errorf("%s read, but not in config.Env", name)
		}
	}
}

// `meshagent help env` prints the table, sorted, one line a variable.
func TestHelpEnv(t *testing.T) {
	var out bytes.Buffer
	if code := execute(&cliContext{args: []string{"help", "env"}, host: hostInputs{env: mapEnvironment(nil)}, stdout: &out, stderr: &out}); code != 0 {
		t.Fatalf("help env: exit %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(config.Env)+1 {
		t.Errorf("help env: %d lines, want a header and %d variables", len(lines), len(config.Env))
	}
	for _, want := range []string{"PROV_CERT", "ISTIO_META_*", "localhost:15053"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help env lacks %q:\n%s", want, out.String())
		}
	}
}

// docs/reference.md's environment section and config.Env name the same
// variables: every variable the docs name is in the table, and every
// variable of the table is named in the docs (#26: 62 were not).
func TestEnvTableMatchesReference(t *testing.T) {
	doc, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Environment variables")
	if !ok {
		t.Fatal("docs/reference.md has no environment section")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]+)(\\*|\\[_EXCLUDE\\])?`").FindAllStringSubmatch(section, -1) {
		if m[1] == "UPPER_SNAKE" || m[1] == "METADATA_DISCOVERY" { // a naming rule; a metadata key
			continue
		}
		named[m[1]] = true
		if m[2] == "[_EXCLUDE]" {
			named[m[1]+"_EXCLUDE"] = true
		}
		if _, ok := config.Find(m[1]); !ok {
			t.Errorf("docs/reference.md names %s, not in config.Env", m[1])
		}
	}
	// The proxy's and standalone's flag tables name their variables too.
	for _, m := range regexp.MustCompile("\\| `--[a-z-]+` \\| `([A-Z][A-Z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		named[m[1]] = true
	}
	var missing []string
	for _, v := range config.Sorted() {
		if !named[v.Name] {
			missing = append(missing, v.Name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("in config.Env but not named in docs/reference.md (%d): %s", len(missing), strings.Join(missing, " "))
	}
}

// Every variable name the commands' sources read (envVar, optionalEnvVar,
// a flag's env binding, the reader's Text, Lookup and Prefixed, a VM's
// istio-start.sh variables) is in config.Env: the paths no test start
// takes (standalone, vm) are checked by their text.
func TestSourcesReadOnlyTableVariables(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	// The last form is a str flag's binding: str(&f.root, ..., "MESHAGENT_ROOT").
	read := regexp.MustCompile(`(?m)(?:envVar\(r, |optionalEnvVar\(r, |env: \[\]string\{|\.Text\(|\.Lookup\(|\.Prefixed\(|vars\[|get\(|setDefault\()"([A-Z][A-Z0-9_]+)"|, "([A-Z][A-Z0-9_]+)"\)$`)
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range read.FindAllStringSubmatch(string(src), -1) {
			name := m[1] + m[2]
			if !strings.Contains(name, "_") && !slices.Contains([]string{"GOGC"}, name) {
				continue // a word, not a variable ("SYSTEM", "ECDSA", "TPROXY")
			}
			found++
			if _, ok := config.Find(name); !ok {
				t.Errorf("%s reads %s, not in config.Env", f, name)
			}
		}
	}
	if found < 50 {
		t.Errorf("found %d reads in the sources: the pattern no longer matches them", found)
	}
}

// A bad value of a variable two configs read (Envoy's and istio-iptables'
// --dual-stack alias) is one line of the start's errors, not two.
func TestBadSharedVariableReportedOnce(t *testing.T) {
	_, err := parseForTest(t, map[string]string{"ISTIO_DUAL_STACK": "maybe"}, "--root", testRoot(t))
	if err == nil {
		t.Fatal("ISTIO_DUAL_STACK=maybe accepted")
	}
	if n := strings.Count(err.Error(), `ISTIO_DUAL_STACK="maybe"`); n != 1 {
		t.Errorf("ISTIO_DUAL_STACK's bad value reported %d times:\n%v", n, err)
	}
}
