package xdsproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/wasm"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/wasmserver"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// wasmPlugin is an ECDS resource as istiod sends a WasmPlugin: an HTTP
// Wasm filter whose code is at url.
func wasmPlugin(t *testing.T, name, url string, policy wasmv3.FailurePolicy) *corev3.TypedExtensionConfig {
	t.Helper()
	f, err := anypb.New(&httpwasm.Wasm{Config: &wasmv3.PluginConfig{
		Name: name, FailurePolicy: policy,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
			Runtime: "envoy.wasm.runtime.v8",
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
				HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(30 * time.Second)}, Sha256: "nil",
			}}},
			EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: map[string]string{
				"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1"}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: f}
}

// serveWasm sets version v: two clusters, three listeners (one named by
// v, so that every version pushes listeners in Delta too), and the ECDS
// resources ecds.
func serveWasm(t *testing.T, cp *xdsserver.Server, v string, ecds ...types.Resource) {
	t.Helper()
	err := cp.SetResources(v, map[resource.Type][]types.Resource{
		resource.ClusterType: xdsserver.Clusters(2, "svc-"+v+"-"),
		resource.ListenerType: {
			xdsserver.Listener("0.0.0.0_80", "80", false, 80),
			xdsserver.Listener("0.0.0.0_8080", "8080", false, 8080),
			xdsserver.Listener("0.0.0.0_9090_"+v, "9090", false, 9090),
		},
		resource.ExtensionConfigType: ecds,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// wasmProxy is a proxy to cp that fetches Wasm modules into its root;
// edit, when given, changes its Wasm config first.
func wasmProxy(t *testing.T, cp *xdsserver.Server, edit ...func(*wasm.Config)) *proxy {
	t.Helper()
	root := tempRoot(t)
	cfg := testConfig(root, cp.Addr())
	cfg.Wasm = wasm.Config{Dir: filepath.Join(root, "var/lib/istio/data")}
	testkit.FillFromTable(t, &cfg.Wasm)
	cfg.Wasm.RetryBackoff, cfg.Wasm.HTTPRequestMaxRetries = time.Millisecond, 2
	for _, e := range edit {
		e(&cfg.Wasm)
	}
	return startProxy(t, cfg, proxyOpts{})
}

// ecdsClient is an Envoy-like client subscribed to ECDS too, keeping its
// resources; like Envoy, it NACKs a Wasm module it cannot load.
func ecdsClient(t *testing.T, p *proxy, delta bool) *xdsserver.Client {
	t.Helper()
	return p.clientWith(t, xdsserver.ClientOptions{Delta: delta, Reconnect: true,
		Types: []string{resource.ClusterType, resource.ListenerType, resource.ExtensionConfigType},
		Keep:  []string{resource.ExtensionConfigType}})
}

// filterOf is the filter an ECDS resource the client holds configures.
func filterOf(t *testing.T, c *xdsserver.Client, name string) any {
	t.Helper()
	a := c.Kept(resource.ExtensionConfigType)[name]
	if a == nil {
		t.Fatalf("the client holds no extension config %s", name)
	}
	_, m := xdsserver.ExtensionConfig(t, a)
	return m
}

// A WasmPlugin whose module is on an HTTP server or in an OCI registry
// reaches Envoy as a local file holding the module (which the client
// checks, as Envoy loads it), and the control plane gets the ACK.
func TestECDSRemoteWasmMadeLocal(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		t.Setenv("DOCKER_CONFIG", t.TempDir())
		srv := wasmserver.NewHTTP(t)
		httpModule := wasmserver.ModuleWith("http")
		srv.Serve("/stats.wasm", httpModule)
		reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
		ociModule := wasmserver.ModuleWith("oci")
		reg.Push(t, "plugins/authz", "v1", wasmserver.Artifact, ociModule, wasmserver.RegistryOptions{})

		cp := controlPlane(t, xdsserver.Options{})
		serveWasm(t, cp, "v1",
			wasmPlugin(t, "default.stats", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED),
			wasmPlugin(t, "default.authz", "oci://"+reg.Host()+"/plugins/authz:v1", wasmv3.FailurePolicy_FAIL_CLOSED))
		p := wasmProxy(t, cp)
		c := ecdsClient(t, p, delta)
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool { return s.Counts[resource.ExtensionConfigType] == 2 }); err != nil {
			t.Fatal(err)
		}
		for name, module := range map[string][]byte{"default.stats": httpModule, "default.authz": ociModule} {
			f, ok := filterOf(t, c, name).(*httpwasm.Wasm)
			if !ok {
				t.Fatalf("%s: the client holds %T, want the Wasm filter", name, filterOf(t, c, name))
			}
			vm := f.GetConfig().GetVmConfig()
			file := vm.GetCode().GetLocal().GetFilename()
			if !strings.HasPrefix(file, p.cfg.Wasm.Dir+"/") {
				t.Errorf("%s: module file %q, want it under %s", name, file, p.cfg.Wasm.Dir)
			}
			if b, err := os.ReadFile(file); err != nil || string(b) != string(module) {
				t.Errorf("%s: module file holds %q (%v), want the served module", name, b, err)
			}
			if env := vm.GetEnvironmentVariables(); env != nil {
				t.Errorf("%s: the agent's variables reached Envoy: %v", name, env)
			}
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.ACKs[resource.ExtensionConfigType] >= 1 }); err != nil {
			t.Fatal(err)
		}
		if n := cp.Stats().NACKs[resource.ExtensionConfigType]; n != 0 {
			t.Errorf("%d ECDS NACKs, want none: %s", n, cp.Stats().LastNACK[resource.ExtensionConfigType])
		}
		// Istio's metrics, by Istio's names and labels.
		for _, m := range []struct {
			name, label, value string
			want               float64
		}{
			{"wasm_remote_fetch_count", "result", "success", 2},
			{"wasm_config_conversion_count", "result", "success", 2},
			{"wasm_cache_lookup_count", "hit", "false", 2},
		} {
			if got := p.metric(t, m.name, m.label, m.value); got < m.want {
				t.Errorf("%s{%s=%q} = %v, want >= %v", m.name, m.label, m.value, got, m.want)
			}
		}
		if got := p.metric(t, "wasm_cache_entries"); got != 2 {
			t.Errorf("wasm_cache_entries = %v, want 2", got)
		}
	})
}

// A module that cannot be fetched follows the plugin's failure policy, as
// with Istio: fail open, an allow-all RBAC filter in its place (the plugin
// left out); fail closed, a deny-all one. Envoy gets them, and the
// control plane an ACK.
func TestECDSFetchFailure(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		srv := wasmserver.NewHTTP(t) // serves nothing: 404
		cp := controlPlane(t, xdsserver.Options{})
		serveWasm(t, cp, "v1",
			wasmPlugin(t, "default.open", srv.URL("/open.wasm"), wasmv3.FailurePolicy_FAIL_OPEN),
			wasmPlugin(t, "default.closed", srv.URL("/closed.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED))
		p := wasmProxy(t, cp)
		c := ecdsClient(t, p, delta)
		if err := c.WaitFor(waitCtx(t), func(s xdsserver.State) bool { return s.Counts[resource.ExtensionConfigType] == 2 }); err != nil {
			t.Fatal(err)
		}
		open, ok := filterOf(t, c, "default.open").(*httprbac.RBAC)
		if !ok || open.GetRules() != nil || open.GetRulesStatPrefix() != "wasm-default-allow" {
			t.Errorf("fail open: %v, want an RBAC filter without rules (allow all)", filterOf(t, c, "default.open"))
		}
		closed, ok := filterOf(t, c, "default.closed").(*httprbac.RBAC)
		if !ok || closed.GetRules() == nil || len(closed.GetRules().GetPolicies()) != 0 || closed.GetRulesStatPrefix() != "wasm-default-deny" {
			t.Errorf("fail closed: %v, want an RBAC filter with empty rules (deny all)", filterOf(t, c, "default.closed"))
		}
		if n := cp.Stats().NACKs[resource.ExtensionConfigType]; n != 0 {
			t.Errorf("%d ECDS NACKs, want none: a failed fetch serves the stand-in", n)
		}
		if got := p.metric(t, "wasm_config_conversion_count", "result", "fetch_failure"); got < 2 {
			t.Errorf("wasm_config_conversion_count{result=fetch_failure} = %v, want >= 2", got)
		}
	})
}

// An ECDS resource the agent cannot read (a Wasm filter without code) is
// NACKed upstream by the agent with the reason, and never reaches Envoy;
// the other types go on.
func TestECDSUnreadableNACKed(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		bad := wasmPlugin(t, "default.nocode", "http://unused", wasmv3.FailurePolicy_FAIL_OPEN)
		f := new(httpwasm.Wasm)
		if err := bad.GetTypedConfig().UnmarshalTo(f); err != nil {
			t.Fatal(err)
		}
		f.GetConfig().GetVmConfig().Code = nil
		bad.TypedConfig, _ = anypb.New(f)
		cp := controlPlane(t, xdsserver.Options{})
		serveWasm(t, cp, "v1", bad)
		p := wasmProxy(t, cp)
		c := ecdsClient(t, p, delta)
		ctx := waitCtx(t)
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.NACKs[resource.ExtensionConfigType] >= 1 }); err != nil {
			t.Fatal(err)
		}
		if msg := cp.Stats().LastNACK[resource.ExtensionConfigType]; !strings.Contains(msg, "no remote and local load") {
			t.Errorf("NACK %q, want the reason", msg)
		}
		if err := c.WaitFor(ctx, hasVersion(resource.ListenerType, "v1", 3)); err != nil {
			t.Fatal(err)
		}
		if n := c.State().Responses[resource.ExtensionConfigType]; n != 0 {
			t.Errorf("the client got %d ECDS responses, want none: a NACKed one is not forwarded", n)
		}
	})
}

// A registry that takes its time holds up the ECDS response only: the
// listeners and clusters of the same push reach Envoy meanwhile, and the
// Wasm filter follows once its module is in.
func TestSlowWasmFetchDoesNotHoldListeners(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		srv := wasmserver.NewHTTP(t)
		release := make(chan struct{})
		srv.Hold("/slow.wasm", release, wasmserver.Module)
		cp := controlPlane(t, xdsserver.Options{})
		serveWasm(t, cp, "v1", wasmPlugin(t, "default.slow", srv.URL("/slow.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED))
		p := wasmProxy(t, cp)
		c := ecdsClient(t, p, delta)
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool {
			return hasVersion(resource.ListenerType, "v1", 3)(s) && hasVersion(resource.ClusterType, "v1", 2)(s)
		}); err != nil {
			t.Fatal(err)
		}
		// The fetch is still held: the listeners did not wait for it.
		testkitWaitRequested(t, srv, "/slow.wasm")
		if n := c.State().Responses[resource.ExtensionConfigType]; n != 0 {
			t.Fatalf("the client got %d ECDS responses before the module was served", n)
		}
		// A listener push while the module is still on its way.
		serveWasm(t, cp, "v2", wasmPlugin(t, "default.slow", srv.URL("/slow.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED))
		if err := c.WaitFor(ctx, hasVersion(resource.ListenerType, "v2", 3)); err != nil {
			t.Fatal(err)
		}
		close(release)
		// (In Delta, v2 did not change it: the v1 response is the one.)
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool { return s.Counts[resource.ExtensionConfigType] == 1 }); err != nil {
			t.Fatal(err)
		}
		if _, ok := filterOf(t, c, "default.slow").(*httpwasm.Wasm); !ok {
			t.Errorf("the client holds %T, want the Wasm filter", filterOf(t, c, "default.slow"))
		}
	})
}

// A fetch ends with the stream it serves: when the control plane goes,
// Envoy's stream ends (Envoy reconnects and is served the cache), and the
// proxy stops waiting for the registry.
func TestWasmFetchEndsWithTheStream(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	release := make(chan struct{})
	defer close(release)
	srv.Hold("/slow.wasm", release, wasmserver.Module)
	cp := controlPlane(t, xdsserver.Options{})
	// No timeout of the fetch's own ends it within the test's wait.
	plugin := wasmPlugin(t, "default.slow", srv.URL("/slow.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED)
	f := new(httpwasm.Wasm)
	if err := plugin.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	f.GetConfig().GetVmConfig().GetCode().GetRemote().GetHttpUri().Timeout = durationpb.New(time.Hour)
	plugin.TypedConfig, _ = anypb.New(f)
	serveWasm(t, cp, "v1", plugin)
	p := wasmProxy(t, cp, func(c *wasm.Config) { c.HTTPRequestTimeout = time.Hour })
	c := ecdsClient(t, p, false)
	ctx := waitCtx(t)
	if err := c.WaitFor(ctx, hasVersion(resource.ListenerType, "v1", 3)); err != nil {
		t.Fatal(err)
	}
	p.waitState(t, "the listeners ACKed", func(s messages.XDSState) bool { return s.LastACK[resource.ListenerType] == "v1" })
	testkitWaitRequested(t, srv, "/slow.wasm")
	cp.Stop()
	p.waitState(t, "serving the cache", func(s messages.XDSState) bool { return s.Upstream == messages.XDSServingCache })
	for srv.Abandoned("/slow.wasm") == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the fetch went on after its live stream ended")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// testkitWaitRequested waits until the server has been asked for path.
func testkitWaitRequested(t *testing.T, srv *wasmserver.HTTP, path string) {
	t.Helper()
	ctx := waitCtx(t)
	for srv.Requests(path) == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("the proxy never asked for %s", path)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Without the Wasm fetch (Wasm.Dir empty), ECDS passes unchanged, and an
// Envoy-like client refuses the remote module: the test client is no
// kinder than Envoy.
func TestECDSUnchangedWithoutWasmFetch(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	srv.Serve("/m.wasm", wasmserver.Module)
	cp := controlPlane(t, xdsserver.Options{})
	serveWasm(t, cp, "v1", wasmPlugin(t, "default.m", srv.URL("/m.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED))
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	c := ecdsClient(t, p, false)
	ctx := waitCtx(t)
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.NACKs[resource.ExtensionConfigType] >= 1 }); err != nil {
		t.Fatal(err)
	}
	if msg := cp.Stats().LastNACK[resource.ExtensionConfigType]; !strings.Contains(msg, xdsserver.ErrRemoteWasm.Error()) {
		t.Errorf("NACK %q, want Envoy's refusal of remote code", msg)
	}
	if n := c.State().Counts[resource.ExtensionConfigType]; n != 0 {
		t.Errorf("the client holds %d extension configs, want none", n)
	}
}
