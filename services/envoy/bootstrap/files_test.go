package bootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

func TestTemplateRendersIstioParameters(t *testing.T) {
	c := testConfig(t)
	c.TemplateFile = filepath.Join(testdata, "minimal.json.tmpl")
	out, err := Write(c)
	if err != nil {
		t.Fatal(err)
	}
	if out.Path != filepath.Join(c.ConfigPath, "envoy-rev.json") || out.Custom {
		t.Fatalf("Write = %+v", out)
	}
	b := loadStrict(t, out.Path)
	if b.GetNode().GetId() != NodeID("sidecar", c.InstanceIPs, c.PodName, c.PodNamespace, "") {
		t.Errorf("nodeID = %s", b.GetNode().GetId())
	}
	if b.GetNode().GetLocality().GetSubZone() != "rack7" || b.GetNode().GetMetadata().GetFields()["NAME"].GetStringValue() != c.PodName {
		t.Errorf("node = %v", b.GetNode())
	}
	if b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue() != 15000 {
		t.Error(".config.ProxyAdminPort not rendered")
	}
	pipe := b.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
	if pipe != c.ConfigPath+"/XDS" {
		t.Errorf(".config.ConfigPath rendered as %s", pipe)
	}
	if b.GetDynamicResources().GetAdsConfig().GetApiType().String() != "DELTA_GRPC" {
		t.Error(".xds_type not rendered")
	}
	if len(b.GetStatsConfig().GetStatsTags()) != 3 || len(b.GetStatsConfig().GetHistogramBucketSettings()) != 2 {
		t.Errorf("stats tags / histogram buckets = %v", b.GetStatsConfig())
	}
	if _, ok := b.GetLayeredRuntime().GetLayers()[0].GetStaticLayer().GetFields()["re2.max_program_size.error_level"]; !ok {
		t.Error(".runtime_flags not rendered")
	}
}

func TestTemplatePrecedence(t *testing.T) {
	custom := filepath.Join(testdata, "custom.json")
	jsonTmpl := filepath.Join(testdata, "minimal.json.tmpl")
	yamlTmpl := filepath.Join(testdata, "minimal.yaml.tmpl")
	for _, tc := range []struct {
		name                                 string
		istioBootstrap, custom, flag, pcPath string
		wantPath                             string // "" ⇒ the custom file; else base name in ConfigPath
		wantNodeID                           string
	}{
		{"built-in", "", "", "", "", "envoy-rev.json", "sidecar~"},
		{"ProxyConfig template path", "", "", "", yamlTmpl, "envoy-rev.yaml", "sidecar~"},
		{"--templateFile beats ProxyConfig", "", "", jsonTmpl, yamlTmpl, "envoy-rev.json", "sidecar~"},
		{"customConfigFile beats templates", "", custom, jsonTmpl, yamlTmpl, "", "custom~"},
		{"ISTIO_BOOTSTRAP beats custom", yamlTmpl, custom, jsonTmpl, "", "envoy-rev.yaml", "sidecar~"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.IstioBootstrap, c.Proxy.CustomConfigFile, c.TemplateFile, c.Proxy.ProxyBootstrapTemplatePath = tc.istioBootstrap, tc.custom, tc.flag, tc.pcPath
			out, err := Write(c)
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(c.ConfigPath, tc.wantPath)
			if tc.wantPath == "" {
				want = custom
			}
			if out.Path != want || out.Custom != (tc.wantPath == "") {
				t.Fatalf("Write = %+v, want path %s", out, want)
			}
			data, err := os.ReadFile(out.Path)
			if err != nil {
				t.Fatal(err)
			}
			js, err := yaml.YAMLToJSON(data)
			if err != nil {
				t.Fatal(err)
			}
			b := &bootstrapv3.Bootstrap{}
			if err := protojson.Unmarshal(js, b); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(b.GetNode().GetId(), tc.wantNodeID) {
				t.Errorf("node id = %s, want prefix %s", b.GetNode().GetId(), tc.wantNodeID)
			}
		})
	}
}

func TestBadInputsNameTheFile(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"missing template", func(c *Config) { c.TemplateFile = filepath.Join(testdata, "nope.json") },
			[]string{"bootstrap template", "nope.json", "no such file"}},
		{"template is a directory", func(c *Config) { c.TemplateFile = testdata },
			[]string{"bootstrap template", testdata}},
		{"template syntax", func(c *Config) {
			c.IstioBootstrap = writeTemp(t, "syntax.tmpl", `{"node": {"id": "{{ .nodeID "}}`)
		},
			[]string{"bootstrap template", "syntax.tmpl"}},
		{"template renders invalid JSON", func(c *Config) { c.TemplateFile = filepath.Join(testdata, "bad-json.json.tmpl") },
			[]string{"bad-json.json.tmpl", "not a valid Envoy bootstrap"}},
		{"template renders a wrong type", func(c *Config) { c.TemplateFile = filepath.Join(testdata, "bad-type.json.tmpl") },
			[]string{"bad-type.json.tmpl", "not a valid Envoy bootstrap"}},
		{"missing custom config file", func(c *Config) { c.Proxy.CustomConfigFile = filepath.Join(testdata, "gone.json") },
			[]string{"customConfigFile", "gone.json"}},
		{"missing override", func(c *Config) { c.OverrideFile = filepath.Join(testdata, "gone.yaml") },
			[]string{"ISTIO_BOOTSTRAP_OVERRIDE", "gone.yaml"}},
		{"invalid override YAML", func(c *Config) { c.OverrideFile = filepath.Join(testdata, "override-bad.yaml") },
			[]string{"ISTIO_BOOTSTRAP_OVERRIDE", "override-bad.yaml", "not YAML or JSON"}},
		{"unparsable labels file", func(c *Config) { c.LabelsFile = filepath.Join(testdata, "bad-labels") },
			[]string{"labels file", "bad-labels"}},
		{"unwritable config dir", func(c *Config) { c.ConfigPath = filepath.Join(notDir, "proxy") },
			[]string{"create config dir", notDir}},
		{"bad runtime value", func(c *Config) {
			c.Proxy.RuntimeValues = map[string]string{"overload.global_downstream_max_connections": "lots"}
		}, []string{"runtimeValues", "lots"}},
		{"bad ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS", func(c *Config) {
			c.Proxy.ProxyMetadata = map[string]string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "-3"}
		}, []string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS", "-3"}},
		{"typed metadata that does not decode", func(c *Config) {
			c.Env = append(c.Env, "ISTIO_META_ENVOY_STATUS_PORT=abc")
		}, []string{"ENVOY_STATUS_PORT", "abc"}},
		{"typed boolean metadata that does not decode", func(c *Config) {
			c.Env = append(c.Env, "ISTIO_META_DNS_CAPTURE=sometimes")
		}, []string{"DNS_CAPTURE", "sometimes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			tc.edit(&c)
			out, err := Write(c)
			if err == nil {
				t.Fatalf("Write = %+v, want an error", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, serr := os.Stat(filepath.Join(c.ConfigPath, "envoy-rev.json")); serr == nil {
				t.Error("a bootstrap was written despite the error")
			}
		})
	}
}

func writeTemp(t *testing.T, name, text string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOverrideToJSON(t *testing.T) {
	for _, tc := range []struct {
		name, hostIP, file, want string
	}{
		{"ipv4 host", "10.128.0.5", filepath.Join(testdata, "override.yaml"), "10.128.0.5:9411"},
		{"ipv6 host bracketed", "fd00::5", filepath.Join(testdata, "override.yaml"), "[fd00::5]:9411"},
		{"explicit brackets not doubled", "fd00::5", writeTemp(t, "o.json", `{"a": "[$(HOST_IP)]:8126"}`), "[fd00::5]:8126"},
		{"no HOST_IP", "", writeTemp(t, "o.json", `{"a": "$(HOST_IP):8126"}`), ":8126"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.OverrideFile, c.HostIP = tc.file, tc.hostIP
			out, err := Write(c)
			if err != nil {
				t.Fatal(err)
			}
			var v any
			if err := json.Unmarshal([]byte(out.ConfigYAML), &v); err != nil {
				t.Fatalf("ConfigYAML is not JSON: %v: %s", err, out.ConfigYAML)
			}
			if !strings.Contains(out.ConfigYAML, `"`+tc.want+`"`) {
				t.Errorf("ConfigYAML = %s, want it to contain %q", out.ConfigYAML, tc.want)
			}
			if strings.Contains(out.ConfigYAML, "HOST_IP") {
				t.Errorf("$(HOST_IP) not replaced: %s", out.ConfigYAML)
			}
		})
	}
	// The YAML override is a valid Bootstrap fragment Envoy can merge.
	c := testConfig(t)
	c.OverrideFile, c.HostIP = filepath.Join(testdata, "override.yaml"), "10.0.0.1"
	out, err := Write(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseBootstrap([]byte(out.ConfigYAML)); err != nil {
		t.Errorf("override does not parse as a Bootstrap: %v", err)
	}
}

func TestCustomConfigUsedAsIs(t *testing.T) {
	c := testConfig(t)
	c.CustomConfigFile = filepath.Join(testdata, "custom.json")
	c.XDSSocket, c.SDSSocket = "", "" // not needed when Envoy gets the file as is
	before, _ := os.ReadFile(c.CustomConfigFile)
	out, err := Write(c)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Custom || out.Path != c.CustomConfigFile {
		t.Fatalf("Write = %+v", out)
	}
	after, _ := os.ReadFile(c.CustomConfigFile)
	if string(before) != string(after) {
		t.Error("custom config file was modified")
	}
	if _, err := os.Stat(filepath.Join(c.ConfigPath, "envoy-rev.json")); err == nil {
		t.Error("envoy-rev.json written for a custom config")
	}
}
