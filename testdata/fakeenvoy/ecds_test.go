package main

import (
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// wasmListener is a listener whose HTTP filter filter comes over ECDS, as
// istiod configures a WasmPlugin.
func wasmListener(t *testing.T, port int, filter string) *listenerv3.Listener {
	t.Helper()
	l := xdsserver.Listener("wasm", "wasm-routes", false, uint32(port))
	f := l.GetFilterChains()[0].GetFilters()[0]
	hcm := new(hcmv3.HttpConnectionManager)
	if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	ads := &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
	hcm.HttpFilters = append([]*hcmv3.HttpFilter{{Name: filter, ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{
		ConfigDiscovery: &corev3.ExtensionConfigSource{ConfigSource: ads, TypeUrls: []string{"type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"}},
	}}}, hcm.HttpFilters...)
	a, err := anypb.New(hcm)
	if err != nil {
		t.Fatal(err)
	}
	f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
	return l
}

// wasmConfig is the filter's ECDS resource, its module at code.
func wasmConfig(t *testing.T, name string, code *corev3.AsyncDataSource) *corev3.TypedExtensionConfig {
	t.Helper()
	a, err := anypb.New(&httpwasm.Wasm{Config: &wasmv3.PluginConfig{Name: name, Vm: &wasmv3.PluginConfig_VmConfig{
		VmConfig: &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8", Code: code}}}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: a}
}

func localCode(path string) *corev3.AsyncDataSource {
	return &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
		Specifier: &corev3.DataSource_Filename{Filename: path}}}}
}

// As Envoy (#35): the stand-in asks for the extension configs its
// listeners discover, refuses (NACKs) a Wasm module it cannot load, an
// oci:// reference or a missing file, and takes one that is a local
// module file.
func TestECDSWasmOnlyLocalModules(t *testing.T) {
	t.Parallel()
	f := newSDSFixture(t, "")
	listeners := []types.Resource{wasmListener(t, testkit.FreePort(t), "default.stats")}
	serve := func(v string, code *corev3.AsyncDataSource) {
		t.Helper()
		if err := f.x.SetResources(v, map[resource.Type][]types.Resource{
			resource.ClusterType: {}, resource.ListenerType: listeners,
			resource.ExtensionConfigType: {wasmConfig(t, "default.stats", code)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	remote := &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
		HttpUri: &corev3.HttpUri{Uri: "oci://registry.example/plugins/stats:v1"}}}}
	serve("v1", remote)
	f.hr.start(t, 0, nil)
	nacks := func(n int, want string) {
		t.Helper()
		testkit.WaitFor(t, "an ECDS NACK: "+want, func() bool {
			st := f.x.Stats()
			return st.NACKs[resource.ExtensionConfigType] >= n && strings.Contains(st.LastNACK[resource.ExtensionConfigType], want)
		})
	}
	nacks(1, "remote Wasm code")
	if st := f.x.Stats(); st.Subscribed[resource.ExtensionConfigType] == nil || st.Subscribed[resource.ExtensionConfigType][0] != "default.stats" {
		t.Errorf("the stand-in subscribed to ECDS %v, want the listener's default.stats", st.Subscribed[resource.ExtensionConfigType])
	}

	missing := filepath.Join(t.TempDir(), "missing.wasm")
	serve("v2", localCode(missing))
	nacks(2, "cannot read the Wasm module")

	module := filepath.Join(t.TempDir(), "stats.wasm")
	testkit.WriteFile(t, module, []byte("\x00asm\x01\x00\x00\x00"))
	acks := f.x.Stats().ACKs[resource.ExtensionConfigType]
	serve("v3", localCode(module))
	testkit.WaitFor(t, "the local module ACKed", func() bool { return f.x.Stats().ACKs[resource.ExtensionConfigType] > acks })
}
