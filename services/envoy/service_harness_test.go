package envoy

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	meshconfig "istio.io/api/mesh/v1alpha1"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"

	// fakeenvoy's dependencies, named here so that `go mod tidy` (which
	// does not look into testdata/) keeps them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	_ "google.golang.org/grpc"
	_ "sigs.k8s.io/yaml"
)

// envoyBinary is the Envoy the tests run: fakeenvoy built in TestMain, or
// $MESHAGENT_TEST_ENVOY (a real envoy).
var (
	envoyBinary string
	realEnvoy   bool
)

// parentEnv makes the test binary act as an agent that starts Envoy and
// waits to be killed (see TestParentDeathKillsEnvoy).
const parentEnv = "MESHAGENT_ENVOY_TEST_PARENT"

func TestMain(m *testing.M) {
	if os.Getenv(parentEnv) != "" {
		os.Exit(runAsParent())
	}
	dir, err := os.MkdirTemp("", "fakeenvoy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	envoyBinary = os.Getenv("MESHAGENT_TEST_ENVOY")
	realEnvoy = envoyBinary != ""
	if !realEnvoy {
		envoyBinary = filepath.Join(dir, "fakeenvoy")
		out, err := exec.Command("go", "build", "-o", envoyBinary, "../../testdata/fakeenvoy").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "go build testdata/fakeenvoy: %v\n%s", err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// testNodeID is the node of writeBootstrap's bootstrap.
const testNodeID = "sidecar~127.0.0.1~test.default~default.svc.cluster.local"

// writeBootstrap writes a minimal bootstrap shaped like Istio's where
// readiness depends on it — admin on 127.0.0.1:port, delta ADS over the
// xds-grpc pipe <dir>/XDS with initial_fetch_timeout 0s — to
// <dir>/envoy-rev.json and returns its path. Envoy is ready only once an
// xDS server on that socket has sent it clusters and listeners (see
// startControlPlane).
func writeBootstrap(dir string, port int) (string, error) {
	ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion: corev3.ApiVersion_V3, InitialFetchTimeout: durationpb.New(0)}
	boot := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: testNodeID, Cluster: "test.default"},
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}},
		}}},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			LdsConfig: ads, CdsConfig: ads,
			AdsConfig: &corev3.ApiConfigSource{
				ApiType: corev3.ApiConfigSource_DELTA_GRPC, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "xds-grpc"}}}},
			},
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{{
			Name: "xds-grpc", ConnectTimeout: durationpb.New(time.Second),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "xds-grpc", Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: filepath.Join(dir, "XDS")}}}}}}}}}},
		}}},
	}
	raw, err := protojson.Marshal(boot)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "envoy-rev.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// writeBootstrapArgs writes writeBootstrap's bootstrap and returns Envoy's
// command line for it, with testArgs (for the tests that run the binary
// without the service).
func writeBootstrapArgs(dir string, port int) ([]string, error) {
	path, err := writeBootstrap(dir, port)
	if err != nil {
		return nil, err
	}
	return CommandLine(testArgs, bootstrap.File{Path: path}), nil
}

// testBootstrap runs Envoy on the bootstrap at path as the agent runs a
// user's custom config file (ProxyConfig.customConfigFile), used as is: the
// tests' hand-made bootstrap takes the agent's own way to Envoy (#34: a
// Config.Prepare hook, for tests only, did this).
func testBootstrap(dir, path string, adminPort int) *bootstrap.Config {
	return &bootstrap.Config{ProxyType: "sidecar", InstanceIPs: []string{"127.0.0.1"}, Proxy: &meshconfig.ProxyConfig{},
		ConfigPath: dir, AdminPort: adminPort, StatusPort: 15020, EnvoyStatusPort: 15021, EnvoyPrometheusPort: 15090,
		CustomConfigFile: path}
}

// testArgs are the tests' Envoy flags: a drain of a second, warnings, one
// worker thread.
var testArgs = ArgsConfig{DrainDuration: time.Second, LogLevel: "warning", Concurrency: 1}

// harness is one Service with its channels, running fakeenvoy (or envoy).
type harness struct {
	t      testing.TB
	svc    *Service
	state  *testkit.Recorder[messages.EnvoyState] // every state published, in order
	health *testkit.HealthRecorder
	drain  *messages.Stream[messages.Drain]
	admin  string
	stderr *testkit.LogBuffer // Envoy's stderr
	logs   *testkit.LogBuffer // the service's log
	xds    *xdsserver.Server
}

// newHarness builds a service on a fresh bootstrap; env is added to Envoy's
// environment and mod may change the config.
func newHarness(t testing.TB, env []string, mod func(*Config)) *harness {
	t.Helper()
	return newHarnessWithClock(t, env, mod, nil)
}

// newHarnessWithClock is newHarness with the service's clock (nil: the
// system's).
func newHarnessWithClock(t testing.TB, env []string, mod func(*Config), clock messages.Clock) *harness {
	t.Helper()
	dir := testkit.ShortTempDir(t, "envoy") // unix socket paths are limited
	port := testkit.FreePort(t)
	boot, err := writeBootstrap(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t:      t,
		state:  &testkit.Recorder[messages.EnvoyState]{},
		health: &testkit.HealthRecorder{},
		drain:  messages.NewStream[messages.Drain](0, nil),
		admin:  fmt.Sprintf("127.0.0.1:%d", port),
		stderr: &testkit.LogBuffer{},
		logs:   &testkit.LogBuffer{},
	}
	cfg := Config{
		BinaryPath:               envoyBinary,
		Bootstrap:                testBootstrap(dir, boot, port),
		Args:                     testArgs,
		AdminAddr:                h.admin,
		DrainQuery:               "inboundonly&graceful",
		ExcludedListeners:        bootstrap.Config{EnvoyStatusPort: 15021, EnvoyPrometheusPort: 15090}.AgentListenerStats(),
		TerminationDrainDuration: time.Second,
		MinimumDrainDuration:     100 * time.Millisecond,
		KillGrace:                2 * time.Second,
		ReadyPollInterval:        20 * time.Millisecond,
		Stdout:                   io.Discard,
		Stderr:                   h.stderr,
		Env:                      append(os.Environ(), env...),
	}
	if mod != nil {
		mod(&cfg)
	}
	log := h.logs.Logger()
	svc, err := New(cfg, Inputs{Drain: h.drain}, Outputs{State: h.state}, messages.NewRuntime(Name, h.health, clock, nil, log))
	if err != nil {
		t.Fatal(err)
	}
	h.svc = svc
	// The control plane Envoy's ADS talks to (the agent's XDS socket).
	h.xds = startControlPlane(t, filepath.Join(dir, "XDS"), minimalMesh(t))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s\nenvoy stderr:\n%s", h.logs, h.stderr)
		}
	})
	return h
}

// serve runs Serve in a goroutine; the returned channel gets its error.
// start runs Serve until cancel, or the end of the test, and returns
// Serve's result on errc.
func (h *harness) start() (cancel context.CancelFunc, errc <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	return cancel, h.serve(ctx)
}

func (h *harness) serve(ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- h.svc.Serve(ctx) }()
	return errc
}

// waitState waits until the published EnvoyState satisfies ok.
func (h *harness) waitState(what string, ok func(messages.EnvoyState) bool) messages.EnvoyState {
	h.t.Helper()
	return testkit.WaitValue(h.t, h.state, "EnvoyState "+what, ok)
}

// killWhen waits until the published EnvoyState satisfies ok, kills that
// Envoy with SIGKILL (as the OOM killer would), and returns the state.
func (h *harness) killWhen(what string, ok func(messages.EnvoyState) bool) messages.EnvoyState {
	h.t.Helper()
	st := h.waitState(what, ok)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		h.t.Fatal(err)
	}
	return st
}

// drainToExit serves until Envoy is ready, drains it as SIGTERM does, and
// returns Serve's result.
func (h *harness) drainToExit() error {
	h.t.Helper()
	errc := h.serve(context.Background())
	h.waitState("ready", ready)
	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
	return h.waitServe(errc)
}

// waitServe waits for Serve's error (hang guard only, not a timing check).
func (h *harness) waitServe(errc <-chan error) error {
	h.t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("Serve did not return")
		return nil
	}
}

// sawHealth says whether the service has reported state with a reason
// holding reasonPart.
func (h *harness) sawHealth(state messages.HealthState, reasonPart string) bool {
	return h.health.Saw(Name, state, reasonPart)
}

func running(s messages.EnvoyState) bool { return s.Phase.Alive() }
func ready(s messages.EnvoyState) bool   { return s.Phase == messages.EnvoyReady }
