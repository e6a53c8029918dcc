package config

import (
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The effective configuration reads as text: one line per part (the
// ProxyConfig, each service, the tree), fields as attributes rather than
// one escaped JSON value (issue 22), and still no secret.
func TestEffectiveConfigLogReadsAsText(t *testing.T) {
	cfg := configWithSecrets(t)
	var logs testkit.LogBuffer
	LogEffective(logs.Logger(), cfg)
	text := logs.String()
	if strings.Contains(text, "s3cr3t") {
		t.Fatalf("a secret was logged:\n%s", text)
	}
	if strings.Contains(text, "invalid IP") {
		t.Errorf("an unset address is logged as invalid:\n%s", text)
	}
	if strings.Contains(text, `\"`) {
		t.Errorf("escaped JSON in the log:\n%s", text)
	}
	for _, want := range []string{"part=proxyConfig ", " statusPort=25020", "part=Envoy ", "part=Certs ", "part=SDS ",
		"part=Status ", "part=DNS ", "part=tree ", "MinimumDrainDuration=5s", "Namespace=shop"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q missing from:\n%s", want, text)
		}
	}
	if n := strings.Count(text, `level=DEBUG msg="effective configuration"`); n < 7 {
		t.Errorf("%d debug lines; want one per part", n)
	}
	for _, name := range []string{"SOME_API_TOKEN", "Authorization"} { // by name only
		if !strings.Contains(text, name) {
			t.Errorf("%s missing from:\n%s", name, text)
		}
	}
	var info testkit.LogBuffer
	LogEffective(slog.New(slog.NewTextHandler(&info, nil)), cfg)
	if info.Len() != 0 {
		t.Errorf("logged at info: %s", info.String())
	}
}

// configWithSecrets is an agent's configuration whose environment and CA
// headers hold secrets ("s3cr3t"), with a ProxyConfig status port of 25020
// and the namespace shop: what the effective configuration must show
// without the secrets.
func configWithSecrets(t *testing.T) *Plan {
	t.Helper()
	env := map[string]string{"CA_HEADER_Authorization": "Bearer s3cr3t-header", "SOME_API_TOKEN": "s3cr3t-env",
		"PROXY_CONFIG": `{"statusPort": 25020}`, "ISTIO_META_DNS_CAPTURE": "true", "POD_NAMESPACE": "shop"}
	cfg, err := parseForTest(t, env, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// An unset address is logged as unset, not as netip's "invalid IP".
func TestEffectiveConfigUnsetAddress(t *testing.T) {
	got := describe(reflect.ValueOf(struct {
		HostIP netip.Addr
		Set    netip.Addr
	}{Set: netip.MustParseAddr("10.0.0.1")}), "")
	if m := got.(map[string]any); m["HostIP"] != nil || m["Set"] != "10.0.0.1" {
		t.Fatalf("describe = %v; want HostIP unset and Set 10.0.0.1", m)
	}
}
