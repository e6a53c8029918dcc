package xdsproxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/wasmserver"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The differential of #35: the same ECDS resources through Istio's own
// agent and through ours, and what an Envoy-like client receives from
// each compared field by field; NACK for NACK.

// istioAgentWasm runs Istio's pilot-agent (no Envoy) against the control
// plane at addr and returns the directory it runs in (its XDS socket is
// ./etc/istio/proxy/XDS there) and where its modules land. Istio keeps
// them in /var/lib/istio/data, an absolute path: it runs in a mount
// namespace of its own whose /var/lib is a directory of the test's.
func istioAgentWasm(t *testing.T, addr string) (dir, dataDir string) {
	t.Helper()
	binary, why := testkit.IstioAgentBinary()
	if binary == "" {
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: Istio's agent runs in a mount namespace of its own")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1)")
	}
	dir = testkit.ShortTempDir(t, "istio")
	varLib := filepath.Join(dir, "varlib")
	certs := filepath.Join(dir, "etc", "certs")
	for _, d := range []string{varLib, certs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ca := pki.NewRoot(t, "differential")
	chain, key := ca.Workload(t, time.Hour)
	for name, b := range map[string][]byte{"cert-chain.pem": chain, "key.pem": key, "root-cert.pem": ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(certs, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, unshare, "--mount", "--propagation", "private", "--", "sh", "-c",
		`mount --bind "$0" /var/lib && mkdir -p /var/lib/istio/data && exec "$@"`, varLib, binary, "proxy", "sidecar")
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "FILE_MOUNTED_CERTS=true", "CLOUD_PLATFORM=none",
		"DISABLE_ENVOY=true", "INSTANCE_IP=127.0.0.1", "POD_NAME=differential", "POD_NAMESPACE=default",
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"discoveryAddress":%q,"controlPlaneAuthPolicy":"NONE"}`,
			testkit.FreePort(t), testkit.FreePort(t), addr),
	}
	log := testkit.NewLogBuffer(t)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cancel(); <-exited })
	socket := filepath.Join(dir, "etc", "istio", "proxy", "XDS")
	testkit.WaitFor(t, "Istio's agent to open its XDS socket", func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("Istio's agent exited at start: %v", err)
		default:
		}
		_, err := os.Stat(socket)
		return err == nil
	})
	return dir, filepath.Join(varLib, "istio", "data")
}

// differentialClient is an Envoy-like client on socket that keeps
// the ECDS resources; files named under /var/lib/istio/data are read
// from dataDir, where Istio's namespace put them.
func differentialClient(t *testing.T, socket string, delta bool, files xdsserver.FileRoot) *xdsserver.Client {
	t.Helper()
	c, err := xdsserver.NewClient(xdsserver.ClientOptions{Target: "unix://" + socket, Reconnect: true, Delta: delta,
		Node:  &corev3.Node{Id: testNode, Cluster: "test"},
		Types: []string{resource.ClusterType, resource.ListenerType, resource.ExtensionConfigType},
		Keep:  []string{resource.ExtensionConfigType}, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// normalized is an ECDS resource with its module's file name made
// relative to the agent's data directory (Istio: <sha256 of the module's
// name>/<checksum>.wasm, ours the same), so that the two agents' answers
// compare field by field.
func normalized(t *testing.T, a *anypb.Any, dataDir string) *corev3.TypedExtensionConfig {
	t.Helper()
	ec := new(corev3.TypedExtensionConfig)
	if err := a.UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	var f interface {
		proto.Message
		GetConfig() *wasmv3.PluginConfig
	}
	switch ec.GetTypedConfig().GetTypeUrl() {
	case "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm":
		f = new(httpwasm.Wasm)
	case "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm":
		f = new(netwasm.Wasm)
	default:
		return ec // a stand-in RBAC filter: compared as it is
	}
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	if l := f.GetConfig().GetVmConfig().GetCode().GetLocal(); l.GetFilename() != "" {
		rel, err := filepath.Rel(dataDir, l.GetFilename())
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("%s: module %s is not under %s", ec.GetName(), l.GetFilename(), dataDir)
		}
		l.Specifier = &corev3.DataSource_Filename{Filename: rel}
	}
	ec.TypedConfig, _ = anypb.New(f)
	return ec
}

// asNetworkFilter is ec as a network Wasm filter (a WasmPlugin of type
// NETWORK).
func asNetworkFilter(t *testing.T, ec *corev3.TypedExtensionConfig) *corev3.TypedExtensionConfig {
	t.Helper()
	f := new(httpwasm.Wasm)
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(&netwasm.Wasm{Config: f.GetConfig()})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: ec.GetName(), TypedConfig: a}
}

// editPlugin is ec with its (HTTP) plugin changed by edit.
func editPlugin(t *testing.T, ec *corev3.TypedExtensionConfig, edit func(*wasmv3.PluginConfig)) *corev3.TypedExtensionConfig {
	t.Helper()
	f := new(httpwasm.Wasm)
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	edit(f.GetConfig())
	a, err := anypb.New(f)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: ec.GetName(), TypedConfig: a}
}

// asTypedStruct is ec's filter inside a TypedStruct, as some control
// planes send it.
func asTypedStruct(t *testing.T, ec *corev3.TypedExtensionConfig) *corev3.TypedExtensionConfig {
	t.Helper()
	f := new(httpwasm.Wasm)
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(xdsserver.TypedStruct(t, f))
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: ec.GetName(), TypedConfig: a}
}

// Istio's agent and ours turn the same WasmPlugins into the same ECDS
// resources: HTTP and network filters, typed or in a TypedStruct, with
// modules over HTTP and in both OCI layouts made local (the
// same file names under the data directory, the same filter otherwise;
// the plugin's own environment kept and the agent's variables gone), a
// checksum that matches and one that does not, a pull secret istiod could
// not read, the failure policies' stand-ins; and both NACK a resource they
// cannot read. State of the World and Delta.
func TestDifferentialECDSWithIstioAgent(t *testing.T) {
	bothProtocols(t, differentialECDS)
}

func differentialECDS(t *testing.T, delta bool) {
	srv := wasmserver.NewHTTP(t)
	srv.Serve("/stats.wasm", wasmserver.ModuleWith("stats"))
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/artifact", "v1", wasmserver.Artifact, wasmserver.ModuleWith("artifact"), wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/compat", "v1", wasmserver.DockerCompat, wasmserver.ModuleWith("compat"), wasmserver.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())

	good := []types.Resource{
		wasmPlugin(t, "default.stats", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED),
		wasmPlugin(t, "default.artifact", "oci://"+reg.Host()+"/plugins/artifact:v1", wasmv3.FailurePolicy_FAIL_CLOSED),
		wasmPlugin(t, "default.compat", "oci://"+reg.Host()+"/plugins/compat:v1", wasmv3.FailurePolicy_FAIL_OPEN),
		wasmPlugin(t, "default.open", srv.URL("/missing-open.wasm"), wasmv3.FailurePolicy_FAIL_OPEN),
		wasmPlugin(t, "default.closed", srv.URL("/missing-closed.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED),
		asNetworkFilter(t, wasmPlugin(t, "default.tcp", "oci://"+reg.Host()+"/plugins/artifact:v1", wasmv3.FailurePolicy_FAIL_CLOSED)),
		asNetworkFilter(t, wasmPlugin(t, "default.tcp-closed", srv.URL("/missing-tcp.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED)),
		asTypedStruct(t, wasmPlugin(t, "default.struct", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_OPEN)),
		editPlugin(t, wasmPlugin(t, "default.sha", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED), func(p *wasmv3.PluginConfig) {
			p.GetVmConfig().GetCode().GetRemote().Sha256 = wasmserver.Sum(wasmserver.ModuleWith("stats"))
		}),
		editPlugin(t, wasmPlugin(t, "default.wrongsha", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED), func(p *wasmv3.PluginConfig) {
			p.GetVmConfig().GetCode().GetRemote().Sha256 = wasmserver.Sum([]byte("another module"))
		}),
		editPlugin(t, wasmPlugin(t, "default.nosecret", "oci://"+reg.Host()+"/plugins/compat:v1", wasmv3.FailurePolicy_FAIL_CLOSED), func(p *wasmv3.PluginConfig) {
			p.GetVmConfig().GetEnvironmentVariables().KeyValues["ISTIO_META_WASM_IMAGE_PULL_SECRET"] = ""
		}),
		editPlugin(t, wasmPlugin(t, "default.ownenv", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_CLOSED), func(p *wasmv3.PluginConfig) {
			env := p.GetVmConfig().GetEnvironmentVariables()
			env.KeyValues["PLUGIN_MODE"] = "strict"
			env.HostEnvKeys = []string{"POD_NAME"}
		}),
	}
	cp := controlPlane(t, xdsserver.Options{})
	serveWasm(t, cp, "v1", good...)

	istioDir, istioData := istioAgentWasm(t, cp.Addr())
	p := wasmProxy(t, cp)
	theirs := differentialClient(t, filepath.Join(istioDir, "etc/istio/proxy/XDS"), delta, xdsserver.FileRoot{From: "/var/lib/istio/data", To: istioData})
	ours := differentialClient(t, p.cfg.SocketPath, delta, xdsserver.FileRoot{})
	ctx := waitCtx(t)
	for who, c := range map[string]*xdsserver.Client{"Istio's": theirs, "ours": ours} {
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool { return s.Counts[resource.ExtensionConfigType] == len(good) }); err != nil {
			t.Fatalf("%s agent: %v", who, err)
		}
	}
	theirRes, ourRes := theirs.Kept(resource.ExtensionConfigType), ours.Kept(resource.ExtensionConfigType)
	for _, r := range good {
		name := r.(*corev3.TypedExtensionConfig).GetName()
		want := normalized(t, theirRes[name], "/var/lib/istio/data")
		got := normalized(t, ourRes[name], p.cfg.Wasm.Dir)
		if !proto.Equal(want, got) {
			t.Errorf("%s: ours differs from Istio's:\nIstio's: %s\nours:    %s", name, prototext.Format(want), prototext.Format(got))
		}
	}

	// v2 adds a Wasm filter without code: both NACK the response upstream,
	// and Envoy keeps v1.
	bad := wasmPlugin(t, "default.nocode", srv.URL("/stats.wasm"), wasmv3.FailurePolicy_FAIL_OPEN)
	f := new(httpwasm.Wasm)
	if err := bad.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatal(err)
	}
	f.GetConfig().GetVmConfig().Code = nil
	bad.TypedConfig, _ = anypb.New(f)
	serveWasm(t, cp, "v2", append(good, bad)...)
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.NACKs[resource.ExtensionConfigType] >= 2 }); err != nil {
		t.Fatalf("want a NACK from each agent: %v", err)
	}
	for who, c := range map[string]*xdsserver.Client{"Istio's": theirs, "ours": ours} {
		if err := c.WaitFor(ctx, hasVersion(resource.ListenerType, "v2", 3)); err != nil {
			t.Fatalf("%s agent: %v", who, err)
		}
		if st := c.State(); st.Versions[resource.ExtensionConfigType] != "v1" || st.Responses[resource.ExtensionConfigType] != 1 {
			t.Errorf("%s agent: the client holds ECDS %s after %d responses, want v1 after 1 (v2 NACKed by the agent, never forwarded)",
				who, st.Versions[resource.ExtensionConfigType], st.Responses[resource.ExtensionConfigType])
		}
	}
}
