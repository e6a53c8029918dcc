package envoy

// Tests of the stand-in Envoy itself (testdata/fakeenvoy): the tests above
// are only as good as it is.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func runFake(t *testing.T, args ...string) (int, string) {
	t.Helper()
	// Without --disable-hot-restart the stand-in, as Envoy, binds the hot
	// restart sockets of base id 0 and leaves its shared memory region in
	// /dev/shm; these runs are about other input.
	cmd := exec.Command(envoyBinary, append([]string{"--disable-hot-restart"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

func TestFakeEnvoyRejectsBadInput(t *testing.T) {
	skipIfReal(t)
	dir := t.TempDir()
	good, err := writeBootstrapArgs(dir, testkit.FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"admin":{"address":{"socket_address":{"address":"127.0.0.1","port_value":99999}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		mention string
	}{
		{"unknown flag", append([]string{"--no-such-flag"}, good...), "no-such-flag"},
		{"invalid bootstrap", []string{"-c", bad}, "PortValue"},
		{"missing bootstrap", []string{"-c", filepath.Join(dir, "none.json")}, "none.json"},
		{"bad drain strategy", append(append([]string{}, good...), "--drain-strategy", "sometimes"), "drain-strategy"},
		{"unknown field", []string{"--config-yaml", "admin: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}\nbogus_field: 1"}, "bogus_field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runFake(t, tc.args...)
			if code != 1 || !strings.Contains(out, tc.mention) {
				t.Fatalf("exit %d, output %q; want 1 naming %s", code, out, tc.mention)
			}
		})
	}
}

// startControlPlane serves resources on socket (Envoy's xds-grpc or
// sds-grpc pipe) with testkit's xDS server.
func startControlPlane(t testing.TB, socket string, resources map[resource.Type][]types.Resource) *xdsserver.Server {
	t.Helper()
	x, err := xdsserver.Start(xdsserver.Options{Addr: "unix:" + socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	setConfig(t, x, "v1", resources)
	return x
}

// minimalMesh is a cluster and a listener: enough for Envoy to turn LIVE.
func minimalMesh(t testing.TB) map[resource.Type][]types.Resource {
	return map[resource.Type][]types.Resource{
		resource.ClusterType:  {&clusterv3.Cluster{Name: "outbound|9080||reviews.default.svc.cluster.local", ConnectTimeout: durationpb.New(time.Second)}},
		resource.ListenerType: {inboundListener(t)},
	}
}

// setConfig replaces what x serves.
func setConfig(t testing.TB, x *xdsserver.Server, version string, resources map[resource.Type][]types.Resource) {
	t.Helper()
	if err := x.SetResources(version, resources); err != nil {
		t.Fatal(err)
	}
}

// seen reports whether x has had a request (ACKs and NACKs among them) of
// typeURL.
func seen(x *xdsserver.Server, typeURL string) bool { return x.Stats().Requests[typeURL] > 0 }

// acked reports whether x has had an ACK of typeURL.
func acked(x *xdsserver.Server, typeURL string) bool { return x.Stats().ACKs[typeURL] > 0 }

// fullBootstrap is a bootstrap shaped like Istio's: ADS over the xds-grpc
// pipe, SDS over sds-grpc, and the 15090/15021-style static listeners.
func fullBootstrap(t *testing.T, dir string, admin, metrics, health int, agentAddr string, apiType corev3.ApiConfigSource_ApiType) string {
	sock := func(host string, port int) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}
	}
	pipe := func(p string) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: p}}}
	}
	cluster := func(name string, addr *corev3.Address) *clusterv3.Cluster {
		return &clusterv3.Cluster{
			Name: name, ConnectTimeout: durationpb.New(time.Second),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}}}}}},
		}
	}
	router, _ := anypb.New(&routerv3.Router{})
	listener := func(port int, path, cluster string) *listenerv3.Listener {
		hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
			StatPrefix: "stats",
			RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
				VirtualHosts: []*routev3.VirtualHost{{Name: "backend", Domains: []string{"*"}, Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: path}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
				}}}},
			}},
			HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return &listenerv3.Listener{
			Address: sock("127.0.0.1", port),
			FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
				Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
		}
	}
	agentHost, agentPort, _ := net.SplitHostPort(agentAddr)
	var ap int
	fmt.Sscan(agentPort, &ap)
	ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3}
	boot := &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "sidecar~127.0.0.1~fake.default~default.svc.cluster.local", Cluster: "fake.default"},
		Admin: &bootstrapv3.Admin{Address: sock("127.0.0.1", admin)},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			LdsConfig: ads, CdsConfig: ads,
			AdsConfig: &corev3.ApiConfigSource{
				ApiType: apiType, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "xds-grpc"}}}},
			},
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Clusters: []*clusterv3.Cluster{
				cluster("prometheus_stats", sock("127.0.0.1", admin)),
				cluster("agent", sock(agentHost, ap)),
				cluster("xds-grpc", pipe(filepath.Join(dir, "XDS"))),
				cluster("sds-grpc", pipe(filepath.Join(dir, "SDS"))),
			},
			Listeners: []*listenerv3.Listener{
				listener(metrics, "/stats/prometheus", "prometheus_stats"),
				listener(health, "/healthz/ready", "agent"),
			},
		},
	}
	raw, err := protojson.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "envoy-rev.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The fake routes its static listeners by the bootstrap, connects to the
// xDS socket once it appears, to the SDS socket for the secrets its
// clusters name (as Envoy, #24), and ACKs what it receives.
func TestFakeEnvoyListenersAndXDS(t *testing.T) {
	skipIfReal(t)
	for _, apiType := range []corev3.ApiConfigSource_ApiType{corev3.ApiConfigSource_DELTA_GRPC, corev3.ApiConfigSource_GRPC} {
		t.Run(apiType.String(), func(t *testing.T) {
			dir := testkit.ShortTempDir(t, "fe") // unix socket paths are limited
			agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "agent saw %s", r.URL.Path)
			}))
			defer agent.Close()
			admin, metrics, health := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
			path := fullBootstrap(t, dir, admin, metrics, health, agent.Listener.Addr().String(), apiType)

			cmd, out := startFake(t, "-c", path, "--disable-hot-restart")
			adminURL := fmt.Sprintf("http://127.0.0.1:%d", admin)
			// Like Envoy with ADS, the fake is not live without its clusters
			// and listeners.
			testkit.WaitFor(t, "fake admin /ready answering", func() bool {
				resp, err := http.Get(adminURL + "/ready")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil
			})
			if code, body := httpGet(t, adminURL+"/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "PRE_INITIALIZING") {
				t.Fatalf("/ready without xDS = %d %q; want 503 PRE_INITIALIZING", code, body)
			}

			// The sockets did not exist when the fake started; now they do.
			mesh := minimalMesh(t) // with istiod's mTLS cluster: Envoy asks SDS only for secrets its config names
			mesh[resource.ClusterType] = append(mesh[resource.ClusterType], xdsserver.MTLSCluster("outbound|9080||ratings.default.svc.cluster.local",
				xdsserver.SDSSecret("default", 0), xdsserver.SDSSecret("ROOTCA", 0)))
			x := startControlPlane(t, filepath.Join(dir, "XDS"), mesh)
			sds := startControlPlane(t, filepath.Join(dir, "SDS"), map[resource.Type][]types.Resource{resource.SecretType: {
				&tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
					CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "chain"}}}}},
				&tlsv3.Secret{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
					TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "roots"}}}}},
			}})
			testkit.WaitFor(t, "CDS, LDS and SDS ACKs", func() bool {
				return acked(x, resource.ClusterType) && acked(x, resource.ListenerType) && acked(sds, resource.SecretType)
			})
			testkit.WaitFor(t, "fake admin /ready 200", func() bool { code, _ := httpGet(t, adminURL+"/ready"); return code == http.StatusOK })

			_, dump := httpGet(t, adminURL+"/config_dump")
			cd, err := envoyadmin.Decode([]byte(dump))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(envoyadmin.Names(cd)[resource.ClusterType], "outbound|9080||reviews.default.svc.cluster.local") {
				t.Fatalf("config_dump lacks the xDS cluster: %s", dump)
			}
			if cd.Secret("ROOTCA") == nil {
				t.Fatalf("config_dump lacks the ROOTCA secret: %s", dump)
			}

			if code, body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", health)); code != 200 || body != "agent saw /healthz/ready" {
				t.Fatalf("health listener: %d %q", code, body)
			}
			if code, body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/stats/prometheus", metrics)); code != 200 || !strings.Contains(body, "envoy_server_state") {
				t.Fatalf("metrics listener: %d %q", code, body)
			}
			if code, _ := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/other", metrics)); code != http.StatusNotFound {
				t.Fatalf("unrouted path: %d; want 404", code)
			}

			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("fake after SIGTERM: %v\n%s", err, out.String())
			}
		})
	}
}

// inboundListener is a listener as a control plane sends one: an HTTP
// connection manager with an inline route config.
func inboundListener(t testing.TB) *listenerv3.Listener {
	t.Helper()
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		t.Fatal(err)
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "inbound_0.0.0.0_15006",
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "inbound", VirtualHosts: []*routev3.VirtualHost{{Name: "all", Domains: []string{"*"}}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &listenerv3.Listener{
		Name: "virtualInbound",
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 15006}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
}

// Like Envoy, the stand-in initialises in order and is not live before it
// has warmed: EDS clusters need their endpoints before LDS is even asked
// for, and listeners need their RDS route configs.
func TestFakeEnvoyInitWaitsForWarming(t *testing.T) {
	skipIfReal(t)
	for _, delta := range []bool{true, false} {
		t.Run(fmt.Sprintf("delta=%v", delta), func(t *testing.T) {
			dir, port, args := fakeBootstrap(t)
			if !delta {
				args = append(args, "--config-yaml", "dynamic_resources: {ads_config: {api_type: GRPC}}")
			}
			ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3}
			edsCluster := &clusterv3.Cluster{Name: "outbound|80||a.default.svc.cluster.local", ConnectTimeout: durationpb.New(time.Second),
				ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
				EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads}}
			cla := &endpointv3.ClusterLoadAssignment{ClusterName: edsCluster.Name}
			rdsListener := inboundListener(t)
			hcm := &hcmv3.HttpConnectionManager{}
			if err := rdsListener.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "80", ConfigSource: ads}}
			hcmAny, err := anypb.New(hcm)
			if err != nil {
				t.Fatal(err)
			}
			rdsListener.FilterChains[0].Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: hcmAny}
			route := &routev3.RouteConfiguration{Name: "80"}

			x := startControlPlane(t, filepath.Join(dir, "XDS"), map[resource.Type][]types.Resource{resource.ClusterType: {edsCluster}, resource.ListenerType: {rdsListener}})
			startFake(t, args...)
			readyURL := fmt.Sprintf("http://127.0.0.1:%d/ready", port)
			testkit.WaitFor(t, "an EDS request", func() bool { return seen(x, resource.EndpointType) })
			if code, body := httpGet(t, readyURL); code != http.StatusServiceUnavailable || !strings.Contains(body, "PRE_INITIALIZING") {
				t.Fatalf("/ready with an unwarmed EDS cluster = %d %q", code, body)
			}
			if seen(x, resource.ListenerType) {
				t.Fatal("LDS requested before the clusters were warm")
			}

			setConfig(t, x, "2", map[resource.Type][]types.Resource{resource.ClusterType: {edsCluster}, resource.EndpointType: {cla}, resource.ListenerType: {rdsListener}})
			testkit.WaitFor(t, "an RDS request", func() bool { return seen(x, resource.RouteType) })
			if code, _ := httpGet(t, readyURL); code != http.StatusServiceUnavailable {
				t.Fatalf("/ready with a listener waiting for its routes = %d", code)
			}

			setConfig(t, x, "3", map[resource.Type][]types.Resource{resource.ClusterType: {edsCluster}, resource.EndpointType: {cla},
				resource.ListenerType: {rdsListener}, resource.RouteType: {route}})
			testkit.WaitFor(t, "/ready 200 once warm", func() bool { code, _ := httpGet(t, readyURL); return code == http.StatusOK })
			_, stats := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/stats?usedonly", port))
			testkit.Contains(t, "stats", stats, "cluster_manager.cds.update_success: ", "listener_manager.lds.update_success: ", "listener_manager.workers_started: 1", "server.state: 0")
		})
	}
}

// A config Envoy cannot load is rejected (NACKed), counted, and leaves the
// stand-in not live.
func TestFakeEnvoyRejectsInvalidConfig(t *testing.T) {
	skipIfReal(t)
	dir, port, args := fakeBootstrap(t)
	// A cluster with a negative timeout fails Envoy's validation.
	x := startControlPlane(t, filepath.Join(dir, "XDS"), map[resource.Type][]types.Resource{resource.ClusterType: {&clusterv3.Cluster{Name: "ok"}, &clusterv3.Cluster{ConnectTimeout: durationpb.New(-time.Second), Name: "neg"}}})
	startFake(t, args...)
	testkit.WaitFor(t, "a CDS NACK", func() bool { return x.Stats().NACKs[resource.ClusterType] > 0 })
	_, stats := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/stats?usedonly", port))
	if !strings.Contains(stats, "cluster_manager.cds.update_rejected: 1") || strings.Contains(stats, "cluster_manager.cds.update_success") {
		t.Fatalf("stats after a rejected CDS:\n%s", stats)
	}
	if code, _ := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/ready", port)); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready after a rejected CDS = %d", code)
	}
}

// A listener Envoy cannot bind (its port held by a socket without
// SO_REUSEPORT) makes Envoy reject the LDS update whole, with its message;
// the stand-in logged it and ACKed. Once the port is free the next update
// is taken.
func TestFakeEnvoyRejectsAListenerItCannotBind(t *testing.T) {
	skipIfReal(t)
	dir, port, args := fakeBootstrap(t)
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := holder.Addr().(*net.TCPAddr).Port
	capture := &listenerv3.Listener{Name: "virtualOutbound", UseOriginalDst: wrapperspb.Bool(true),
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(held)}}}}}
	resources := map[resource.Type][]types.Resource{resource.ClusterType: {&clusterv3.Cluster{Name: "ok"}}, resource.ListenerType: {capture}}
	x := startControlPlane(t, filepath.Join(dir, "XDS"), resources)
	startFake(t, args...)
	testkit.WaitFor(t, "an LDS NACK", func() bool { return x.Stats().NACKs[resource.ListenerType] > 0 })
	want := fmt.Sprintf("Error adding/updating listener(s) virtualOutbound: cannot bind '127.0.0.1:%d': Address already in use\n", held)
	if got := x.Stats().LastNACK[resource.ListenerType]; got != want {
		t.Errorf("the NACK's message = %q, want Envoy's %q", got, want)
	}
	_, stats := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/stats?usedonly", port))
	testkit.Contains(t, "stats", stats, "listener_manager.lds.update_rejected: 1")

	holder.Close()
	changed := proto.Clone(capture).(*listenerv3.Listener)
	changed.StatPrefix = "changed" // Delta sends only what changed
	resources[resource.ListenerType] = []types.Resource{changed}
	setConfig(t, x, "2", resources)
	testkit.WaitFor(t, "an LDS ACK once the port is free", func() bool { return acked(x, resource.ListenerType) })
	testkit.WaitFor(t, "the capture listener accepting", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", held))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// fakeBootstrap is a directory for a test's sockets, the admin port and
// the command line of an Envoy with the test bootstrap (writeBootstrapArgs).
func fakeBootstrap(t *testing.T) (dir string, port int, args []string) {
	t.Helper()
	dir = testkit.ShortTempDir(t, "fe") // unix socket paths are limited
	port = testkit.FreePort(t)
	args, err := writeBootstrapArgs(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	return dir, port, args
}

// startFake runs envoyBinary (the stand-in, or a real Envoy) with args
// until the end of the test, and returns it with its output.
func startFake(t *testing.T, args ...string) (*exec.Cmd, *testkit.LogBuffer) {
	t.Helper()
	cmd := exec.Command(envoyBinary, args...)
	out := testkit.NewLogBuffer(t)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}
