package envoy

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// The test binary is its own renderer child, as the agent's binary is
// (TestMain hands RenderCommand to RenderMain).
func testRenderer() string { return os.Args[0] }

// TestRenderInChildWritesWhatTheAgentWould: every way of producing a
// bootstrap gives, from a child, the file and the command line parts the
// agent itself produces, ProxyConfig included (it crosses as proto JSON).
func TestRenderInChildWritesWhatTheAgentWould(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*BootstrapConfig)
	}{
		{"built-in", func(*BootstrapConfig) {}},
		{"built-in, ProxyConfig with tracing and a drain", func(c *BootstrapConfig) {
			c.Proxy.Tracing = &meshv1alpha1.Tracing{Tracer: &meshv1alpha1.Tracing_Zipkin_{
				Zipkin: &meshv1alpha1.Tracing_Zipkin{Address: "zipkin.istio-system:9411"}}}
			c.Proxy.TerminationDrainDuration = durationpb.New(7e9)
			c.MetadataDiscovery = new(bool)
		}},
		{"template", func(c *BootstrapConfig) { c.TemplateFile = filepath.Join(testdata, "minimal.json.tmpl") }},
		{"YAML template", func(c *BootstrapConfig) { c.TemplateFile = filepath.Join(testdata, "minimal.yaml.tmpl") }},
		{"override", func(c *BootstrapConfig) {
			c.OverrideFile, c.HostIP = filepath.Join(testdata, "override.yaml"), "10.128.0.5"
		}},
		{"custom config file", func(c *BootstrapConfig) { c.Proxy.CustomConfigFile = filepath.Join(testdata, "custom.json") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.Proxy = proto.Clone(c.Proxy).(*meshv1alpha1.ProxyConfig)
			tc.edit(&c)
			want, err := WriteBootstrap(c)
			if err != nil {
				t.Fatal(err)
			}
			wantData := readIfRendered(t, want)
			if !want.Custom {
				os.Remove(want.Path)
			}
			got, err := renderInChild(testRenderer(), c)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("child rendered %+v, the agent %+v", got, want)
			}
			if gotData := readIfRendered(t, got); !bytes.Equal(gotData, wantData) {
				t.Fatalf("the child's %s differs from the agent's:\n%s\nwant:\n%s", got.Path, gotData, wantData)
			}
		})
	}
}

// TestRenderInChildErrorsNameTheInput: a bad input fails the child's render
// with the message the agent itself would give, and a renderer that cannot
// run is named.
func TestRenderInChildErrorsNameTheInput(t *testing.T) {
	c := testConfig(t)
	c.TemplateFile = filepath.Join(testdata, "nope.json")
	_, want := WriteBootstrap(c)
	_, err := renderInChild(testRenderer(), c)
	if err == nil || want == nil || err.Error() != want.Error() {
		t.Fatalf("child's error %v, the agent's %v", err, want)
	}

	_, err = renderInChild("/bin/false", testConfig(t))
	if err == nil || !strings.Contains(err.Error(), "/bin/false") || !strings.Contains(err.Error(), RenderCommand) {
		t.Fatalf("a renderer that fails: %v, want an error naming it", err)
	}
}

// TestLaterStartsWriteTheFirstRender: the first start renders; a later one
// writes the same bytes again, even with the file gone and an input
// changed since (Istio renders once per agent start too), and asks no
// child (the renderer is broken by then).
func TestLaterStartsWriteTheFirstRender(t *testing.T) {
	c := testConfig(t)
	labels := filepath.Join(t.TempDir(), "labels")
	if err := os.WriteFile(labels, []byte("app=\"reviews\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.LabelsFile = labels
	cfg := Config{Bootstrap: &c, RenderExe: testRenderer()}
	first, err := cfg.render(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(first.data, []byte(`"reviews"`)) {
		t.Fatalf("first render lacks the labels:\n%s", first.data)
	}
	if err := os.WriteFile(labels, []byte("app=\"changed\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(first.boot.Path); err != nil {
		t.Fatal(err)
	}
	cfg.RenderExe = "/bin/false"
	again, err := cfg.render(first)
	if err != nil {
		t.Fatal(err)
	}
	if got := readIfRendered(t, again.boot); !bytes.Equal(got, first.data) {
		t.Fatalf("a later start wrote\n%s\nwant the first render\n%s", got, first.data)
	}
}

// readIfRendered is the bootstrap file's content; nil for a custom file.
func readIfRendered(t *testing.T, b Bootstrap) []byte {
	t.Helper()
	if b.Custom {
		return nil
	}
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
