package wasm

import (
	"strings"
	"testing"
	"time"

	udpa "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/testdata/testkit/wasmserver"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// plugin is a WasmPlugin as istiod sends it: remote code at url, the
// agent's variables in the VM's environment beside the plugin's own.
func plugin(url, sha string, policy wasmv3.FailurePolicy, env map[string]string) *wasmv3.PluginConfig {
	kv := map[string]string{"PLUGIN_OWN": "kept", resourceVersionEnv: "7", pullPolicyEnv: "IfNotPresent"}
	for k, v := range env {
		kv[k] = v
	}
	return &wasmv3.PluginConfig{
		Name:          "ns.plugin",
		FailurePolicy: policy,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
			Runtime: "envoy.wasm.runtime.v8",
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
				HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(30 * time.Second)},
				Sha256:  sha,
			}}},
			EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: kv},
		}},
	}
}

func extensionConfig(t *testing.T, name string, filter proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: mustAny(filter)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A remote module is fetched and the resource rewritten to the local file,
// the agent's variables gone from the VM's environment and the plugin's
// own kept; HTTP and network filters alike, and a TypedStruct one too
// (which becomes the typed filter, as with Istio).
func TestRewriteRemoteToLocal(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	srv.Serve("/p.wasm", wasmserver.Module)
	c, cfg := startCache(t, nil)
	url := srv.URL("/p.wasm")

	httpFilter := &httpwasm.Wasm{Config: plugin(url, wasmserver.Sum(wasmserver.Module), wasmv3.FailurePolicy_FAIL_CLOSED, nil)}
	netFilter := &netwasm.Wasm{Config: plugin(url, "nil", wasmv3.FailurePolicy_FAIL_CLOSED, nil)}
	typedStruct := xdsserver.TypedStruct(t, httpFilter)

	for _, tc := range []struct {
		name string
		in   proto.Message
	}{{"http", httpFilter}, {"network", netFilter}, {"typed-struct", typedStruct}} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := c.Rewrite(ctxOf(t), extensionConfig(t, "ns.plugin", tc.in))
			if err != nil {
				t.Fatal(err)
			}
			ec, m := xdsserver.ExtensionConfig(t, out)
			if ec.GetName() != "ns.plugin" {
				t.Errorf("name %q, want ns.plugin", ec.GetName())
			}
			var p *wasmv3.PluginConfig
			switch f := m.(type) {
			case *httpwasm.Wasm:
				p = f.GetConfig()
			case *netwasm.Wasm:
				p = f.GetConfig()
			default:
				t.Fatalf("rewritten to %T, want a Wasm filter", m)
			}
			vm := p.GetVmConfig()
			file := vm.GetCode().GetLocal().GetFilename()
			if file == "" {
				t.Fatalf("code %v, want a local file", vm.GetCode())
			}
			wantModule(t, cfg, file, wasmserver.Module)
			if kv := vm.GetEnvironmentVariables().GetKeyValues(); len(kv) != 1 || kv["PLUGIN_OWN"] != "kept" {
				t.Errorf("VM environment %v, want only the plugin's own PLUGIN_OWN", kv)
			}
			if vm.GetRuntime() != "envoy.wasm.runtime.v8" || p.GetName() != "ns.plugin" {
				t.Errorf("runtime %q, plugin %q: the rest of the filter must be kept", vm.GetRuntime(), p.GetName())
			}
		})
	}
}

// A fetch that fails gives Istio's stand-in by the failure policy: fail
// open, an RBAC filter with no rules (allows all: the plugin is left out);
// fail closed, one with empty rules (denies all). The deprecated fail_open
// counts when no policy is set. No error: the response is not NACKed.
func TestRewriteFetchFailure(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	c, _ := startCache(t, nil, func(c *Config) { c.HTTPRequestMaxRetries = 1 })
	url := srv.URL("/missing.wasm")
	for _, tc := range []struct {
		name     string
		policy   wasmv3.FailurePolicy
		failOpen bool
		allow    bool
	}{
		{"fail-open", wasmv3.FailurePolicy_FAIL_OPEN, false, true},
		{"fail-closed", wasmv3.FailurePolicy_FAIL_CLOSED, true, false},
		{"deprecated-fail-open", wasmv3.FailurePolicy_UNSPECIFIED, true, true},
		{"unspecified", wasmv3.FailurePolicy_UNSPECIFIED, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := plugin(url, "", tc.policy, nil)
			p.FailOpen = tc.failOpen //nolint:staticcheck
			for _, filter := range []proto.Message{&httpwasm.Wasm{Config: p}, &netwasm.Wasm{Config: proto.Clone(p).(*wasmv3.PluginConfig)}} {
				out, err := c.Rewrite(ctxOf(t), extensionConfig(t, "ns.plugin", filter))
				if err != nil {
					t.Fatal(err)
				}
				ec, m := xdsserver.ExtensionConfig(t, out)
				if ec.GetName() != "ns.plugin" {
					t.Errorf("stand-in named %q, want the plugin's ns.plugin", ec.GetName())
				}
				switch r := m.(type) {
				case *httprbac.RBAC:
					if (r.GetRules() == nil) != tc.allow || r.GetRulesStatPrefix() != statPrefix(tc.allow) {
						t.Errorf("http stand-in %v, want allow=%v", r, tc.allow)
					}
				case *netrbac.RBAC:
					if (r.GetRules() == nil) != tc.allow || r.GetStatPrefix() != statPrefix(tc.allow) {
						t.Errorf("network stand-in %v, want allow=%v", r, tc.allow)
					}
				default:
					t.Errorf("stand-in is %T, want an RBAC filter", m)
				}
			}
		})
	}
	// A pull secret named but empty (istiod could not read it) fails too.
	out, err := c.Rewrite(ctxOf(t), extensionConfig(t, "x", &httpwasm.Wasm{Config: plugin(url, "", wasmv3.FailurePolicy_FAIL_CLOSED, map[string]string{pullSecretEnv: ""})}))
	if err != nil {
		t.Fatal(err)
	}
	if _, m := xdsserver.ExtensionConfig(t, out); !strings.Contains(string(m.ProtoReflect().Descriptor().FullName()), "rbac") {
		t.Errorf("empty pull secret: %T, want the deny stand-in", m)
	}
}

func statPrefix(allow bool) string {
	if allow {
		return allowStatPrefix
	}
	return denyStatPrefix
}

// What is not remote Wasm passes unchanged; what cannot be read is an
// error (the response is NACKed).
func TestRewritePassesAndRefuses(t *testing.T) {
	c, _ := startCache(t, nil)
	local := &httpwasm.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
		Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: "/etc/istio/extensions/p.wasm"}}}}}}}}
	for name, in := range map[string]*anypb.Any{
		"local":    extensionConfig(t, "local", local),
		"not-wasm": extensionConfig(t, "rbac", &httprbac.RBAC{}),
		"struct":   extensionConfig(t, "ts", &udpa.TypedStruct{TypeUrl: "type.googleapis.com/other.Type"}),
	} {
		out, err := c.Rewrite(ctxOf(t), in)
		if err != nil || !proto.Equal(out, in) {
			t.Errorf("%s: %v, %v; want it unchanged", name, out, err)
		}
	}
	noCode := &httpwasm.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{}}}}
	noTyped, _ := anypb.New(&corev3.TypedExtensionConfig{Name: "empty"})
	notECDS := mustAny(&httprbac.RBAC{})
	for name, in := range map[string]*anypb.Any{
		"no-code": extensionConfig(t, "nocode", noCode), "no-typed-config": noTyped, "not-an-extension-config": notECDS,
	} {
		if _, err := c.Rewrite(ctxOf(t), in); err == nil {
			t.Errorf("%s: no error, want one (a NACK)", name)
		}
	}
	res := []*anypb.Any{extensionConfig(t, "local", local), notECDS}
	if err := c.RewriteAll(ctxOf(t), res); err == nil || !strings.Contains(err.Error(), "1 error(s)") {
		t.Errorf("RewriteAll: %v, want one error", err)
	}
}
